package spec

import (
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// stringKind is a class of string value: a check, the words that say what is
// allowed, and, where one regular expression captures it, the schema pattern.
type stringKind struct {
	check   func(string) string // "" when valid, else what is wrong
	allowed string
	pattern string
}

// Every string that reaches the trainer's command line is restricted to
// characters no shell treats specially: [A-Za-z0-9._/:,-]. See
// manifests.Entrypoint.
var (
	hfNamePart  = `[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?`
	hfRepoRE    = regexp.MustCompile(`^(?:` + hfNamePart + `/)?` + hfNamePart + `$`)
	tokenRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	modulesRE   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(,[A-Za-z0-9_][A-Za-z0-9_.-]*)*$`)
	versionRE   = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)
	runIDRE     = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$`)
	bucketRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$`)
	prefixRE    = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`)
	reservRE    = regexp.MustCompile(`^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
	projectRE   = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	storageRE   = regexp.MustCompile(`^[0-9]+(?:\.[0-9]+)?(?:k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$`)
	hfTokenRE   = regexp.MustCompile(`hf_[A-Za-z0-9]{30,}`)
	imageCharRE = regexp.MustCompile(`^[A-Za-z0-9._/:@-]+$`)
	gsFolderRE  = regexp.MustCompile(`^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*/?$`)
	revisionRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	// A column name reaches the trainer as data, never a shell; braces would
	// make it unreadable as a placeholder, control characters unprintable.
	columnRE = regexp.MustCompile(`^[^{}\x00-\x1f\x7f]+$`)
)

// Placeholders are the column names a prompt template refers to, in order,
// once each; the trainer (data.placeholders) reads templates by the same
// grammar: {column}, with {{ and }} for literal braces. A malformed template
// gives a message saying where.
func Placeholders(template string) ([]string, string) {
	var names []string
	for i := 0; i < len(template); i++ {
		c := template[i]
		switch {
		case c == '{' && i+1 < len(template) && template[i+1] == '{', c == '}' && i+1 < len(template) && template[i+1] == '}':
			i++
		case c == '}':
			return nil, fmt.Sprintf("has a lone '}' at byte %d (write }} for a literal brace)", i)
		case c == '{':
			end := strings.IndexAny(template[i+1:], "{}")
			if end < 0 || template[i+1+end] != '}' {
				return nil, fmt.Sprintf("has a lone '{' at byte %d (write {{ for a literal brace)", i)
			}
			name := template[i+1 : i+1+end]
			if strings.TrimSpace(name) == "" {
				return nil, fmt.Sprintf("has an empty placeholder at byte %d", i)
			}
			if msg := checkColumn(name); msg != "" {
				return nil, fmt.Sprintf("placeholder {%s} at byte %d %s (allowed: %s)", name, i, msg, columnAllowed)
			}
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
			i += end + 1
		}
	}
	return names, ""
}

const columnAllowed = "a column name: up to 128 bytes, no braces, control characters, or leading or trailing spaces"

func checkColumn(s string) string {
	if !columnRE.MatchString(s) || !utf8.ValidString(s) {
		return "is not a column name"
	}
	if strings.TrimSpace(s) != s {
		return "has leading or trailing spaces"
	}
	if len(s) > 128 {
		return "is longer than 128 bytes"
	}
	return ""
}

var kinds = map[string]stringKind{
	"gsfolder": {
		check: func(s string) string {
			m := gsFolderRE.FindStringSubmatch(s)
			if m == nil {
				return "is not a gs:// folder"
			}
			if msg := checkBucket(m[1]); msg != "" {
				return "names a bucket that " + msg
			}
			for _, part := range strings.Split(strings.TrimPrefix(s, "gs://"), "/") {
				if part == "." || part == ".." {
					return "has a '.' or '..' part"
				}
			}
			return ""
		},
		allowed: "gs://bucket/folder: a bucket name, then slash-separated parts of letters, digits, '.', '_' and '-'",
		pattern: gsFolderRE.String(),
	},
	"revision": {
		check: func(s string) string {
			if !revisionRE.MatchString(s) || strings.Contains(s, "..") {
				return "is not a revision"
			}
			return ""
		},
		allowed: "a branch, tag or commit: letters, digits, '.', '_', '/' and '-', starting with a letter or digit, no '..'",
		pattern: revisionRE.String(),
	},
	"text": {
		check: func(s string) string {
			if strings.ContainsRune(s, 0) {
				return "contains a NUL character"
			}
			return ""
		},
		allowed: "free text (it reaches the trainer as data, never through a shell)",
		pattern: `^[^\x00]*$`,
	},
	"template": {
		check: func(s string) string {
			if strings.ContainsRune(s, 0) {
				return "contains a NUL character"
			}
			_, msg := Placeholders(s)
			return msg
		},
		allowed: "free text with {column} placeholders; {{ and }} are literal braces",
		pattern: `^[^\x00]*$`,
	},
	"column": {
		check:   checkColumn,
		allowed: columnAllowed,
		pattern: columnRE.String(),
	},
	"hfrepo": {
		check: func(s string) string {
			if !hfRepoRE.MatchString(s) || strings.Contains(s, "--") || strings.Contains(s, "..") {
				return "is not a Hugging Face repository id"
			}
			return ""
		},
		allowed: "owner/name: letters, digits, '-', '_' and '.', each part at most 96 long, starting and ending with a letter or digit, no '--' or '..'",
		pattern: hfRepoRE.String(),
	},
	"token": {
		check:   regexpCheck(tokenRE, "is not a simple name"),
		allowed: "letters, digits, '.', '_' and '-', starting with a letter or digit",
		pattern: tokenRE.String(),
	},
	"modules": {
		check:   regexpCheck(modulesRE, "is not a module list"),
		allowed: "all-linear, or comma-separated module names of letters, digits, '_', '.' and '-'",
		pattern: modulesRE.String(),
	},
	"version": {
		check:   regexpCheck(versionRE, "is not a version"),
		allowed: "MAJOR.MINOR.PATCH, e.g. 2.48.0",
		pattern: versionRE.String(),
	},
	"runid": {
		check:   regexpCheck(runIDRE, "is not a run id"),
		allowed: "1 to 40 lower-case letters, digits and '-', starting and ending with a letter or digit",
		pattern: runIDRE.String(),
	},
	"label": {
		check:   k8sCheck(validation.IsValidLabelValue, "is not a label value"),
		allowed: "a Kubernetes label value: up to 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
		pattern: `^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`,
	},
	"dns1035": {
		check:   k8sCheck(validation.IsDNS1035Label, "is not a DNS-1035 label"),
		allowed: "a DNS-1035 label: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
		pattern: `^[a-z](?:[-a-z0-9]*[a-z0-9])?$`,
	},
	"dns1123": {
		check:   k8sCheck(validation.IsDNS1123Label, "is not a DNS-1123 label"),
		allowed: "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit",
		pattern: `^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$`,
	},
	"secretkey": {
		check:   k8sCheck(validation.IsConfigMapKey, "is not a Secret key"),
		allowed: "a Secret key: letters, digits, '-', '_' and '.'",
		pattern: `^[-._A-Za-z0-9]+$`,
	},
	"reservation": {
		check:   regexpCheck(reservRE, "is not a reservation name"),
		allowed: "a Compute Engine resource name: 1 to 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
		pattern: reservRE.String(),
	},
	"project": {
		// https://cloud.google.com/resource-manager/docs/creating-managing-projects
		// ("Project ID requirements").
		check:   regexpCheck(projectRE, "is not a project ID"),
		allowed: "a Google Cloud project ID: 6 to 30 lower-case letters, digits and '-', starting with a letter, not ending with '-'",
		pattern: projectRE.String(),
	},
	"storage": {
		check: func(s string) string {
			q, err := resource.ParseQuantity(s)
			if err != nil || !storageRE.MatchString(s) {
				return "is not a Kubernetes quantity of bytes"
			}
			if q.Cmp(resource.MustParse("1Gi")) < 0 {
				return "is less than 1Gi"
			}
			return ""
		},
		allowed: "a Kubernetes quantity of bytes of at least 1Gi, such as 200Gi or 1Ti",
		pattern: storageRE.String(),
	},
	"bucket": {
		check:   checkBucket,
		allowed: "a Cloud Storage bucket name: 3 to 63 lower-case letters, digits, '-', '_' and '.' (up to 222 with dots, 63 per dot-separated part), starting and ending with a letter or digit, not an IP address, not starting with 'goog' nor containing 'google'",
		pattern: bucketRE.String(),
	},
	"prefix": {
		check: func(s string) string {
			if !prefixRE.MatchString(s) {
				return "is not an object prefix"
			}
			for _, part := range strings.Split(s, "/") {
				if part == "." || part == ".." {
					return "has a '.' or '..' part"
				}
			}
			return ""
		},
		allowed: "slash-separated parts of letters, digits, '.', '_' and '-', no leading, trailing or double slash, no '.' or '..' parts",
		pattern: prefixRE.String(),
	},
	"image": {
		check: func(s string) string {
			if !imageCharRE.MatchString(s) {
				return "is not a container image reference"
			}
			if _, err := reference.ParseNormalizedNamed(s); err != nil {
				return "is not a container image reference: " + err.Error()
			}
			return ""
		},
		allowed: "[registry/]repository[:tag][@digest], e.g. rayproject/ray:2.48.0",
		pattern: imageCharRE.String(),
	},
	"quantity": {
		check: func(s string) string {
			q, err := resource.ParseQuantity(s)
			if err != nil {
				return "is not a Kubernetes quantity"
			}
			if q.Sign() <= 0 {
				return "must be positive"
			}
			return ""
		},
		allowed: "a positive Kubernetes quantity such as 24, 500m, 64Gi",
		pattern: `^[0-9]+(?:\.[0-9]+)?(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`,
	},
}

func regexpCheck(re *regexp.Regexp, wrong string) func(string) string {
	return func(s string) string {
		if !re.MatchString(s) {
			return wrong
		}
		return ""
	}
}

// k8sCheck wraps one of Kubernetes' own name validators; its long message
// repeats what the kind's allowed text says, so only the verdict is kept.
func k8sCheck(f func(string) []string, wrong string) func(string) string {
	return func(s string) string {
		if len(f(s)) > 0 {
			return wrong
		}
		return ""
	}
}

func checkBucket(s string) string {
	if !bucketRE.MatchString(s) {
		return "is not a bucket name"
	}
	parts := strings.Split(s, ".")
	if len(parts) == 1 && len(s) > 63 {
		return "is longer than 63 characters without dots"
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 {
			return "has an empty or over-long dot-separated part"
		}
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return "is an IP address"
	}
	if strings.HasPrefix(s, "goog") || strings.Contains(s, "google") || strings.Contains(s, "g00gle") {
		return "starts with 'goog' or contains 'google'"
	}
	return ""
}

// findSecrets rejects any string that looks like a Hugging Face token: a
// token must live in Secret Manager, never in a spec, where it would reach
// run records, events and logs.
func findSecrets(v reflect.Value, path string) Problems {
	var ps Problems
	for _, f := range fieldsOf(v.Type()).list {
		fv := v.Field(f.index)
		p := joinPath(path, f.name)
		switch {
		case f.typ.Kind() == reflect.Struct:
			ps = append(ps, findSecrets(fv, p)...)
		case f.typ.Kind() == reflect.Slice && f.typ.Elem().Kind() == reflect.String:
			for i := 0; i < fv.Len(); i++ {
				if hfTokenRE.MatchString(fv.Index(i).String()) {
					ps = append(ps, Problem{Path: indexPath(p, i), Message: "looks like a Hugging Face token (tokens belong in the Secret named by cluster.hfSecret, never in a spec)"})
				}
			}
		case f.typ.Kind() == reflect.Slice && f.typ.Elem().Kind() == reflect.Struct:
			for i := 0; i < fv.Len(); i++ {
				ps = append(ps, findSecrets(fv.Index(i), indexPath(p, i))...)
			}
		case f.typ.Kind() == reflect.String && hfTokenRE.MatchString(fv.String()):
			ps = append(ps, Problem{Path: p, Message: "looks like a Hugging Face token (tokens belong in the Secret named by cluster.hfSecret, never in a spec)"})
		}
	}
	return ps
}

// LooksLikeSecret reports whether s contains something shaped like a Hugging
// Face token.
func LooksLikeSecret(s string) bool { return hfTokenRE.MatchString(s) }

// CheckRevision returns "" when rev is a valid dataset revision, else what
// is wrong and what is allowed.
func CheckRevision(rev string) string {
	return checkString(rev, rules{kind: "revision"})
}

// CheckRunID returns "" when id is a valid run ID, else what is wrong and
// what is allowed.
func CheckRunID(id string) string {
	return checkString(id, rules{kind: "runid"})
}
