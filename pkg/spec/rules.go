package spec

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

const rootPath = "$"

// Problem is one thing wrong with a spec: where, and what is wrong and allowed.
type Problem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p Problem) String() string { return p.Path + ": " + p.Message }

// Problems is every problem found in a spec. It is the error Parse and
// Validate return for bad input; no redelivery can fix it.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return "invalid job spec: " + strings.Join(lines, "; ")
}

func joinPath(path, key string) string {
	if path == "" || path == rootPath {
		return key
	}
	return path + "." + key
}

func displayPath(path string) string {
	if path == "" {
		return rootPath
	}
	return path
}

// Duration is a time.Duration written as a Go duration string ("90m", "24h").
type Duration time.Duration

const (
	minute = time.Minute
	hour   = time.Hour
)

var durationType = reflect.TypeOf(Duration(0))

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		v = -1 // an invalid marker: Validate reports it with its path
	}
	*d = Duration(v)
	return nil
}

// rules are the parsed `spec` tag of a field.
type rules struct {
	required bool
	optional bool // an empty string is allowed (and skips the kind check)
	kind     string
	enum     []string
	min, max string
	gt       string
}

func parseRules(tag string) rules {
	var r rules
	for _, part := range strings.Split(tag, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "":
		case "required":
			r.required = true
		case "optional":
			r.optional = true
		case "kind":
			r.kind = v
		case "enum":
			r.enum = strings.Split(v, "|")
		case "min":
			r.min = v
		case "max":
			r.max = v
		case "gt":
			r.gt = v
		default:
			panic("spec: unknown rule " + k)
		}
	}
	return r
}

type field struct {
	name  string
	index int
	typ   reflect.Type
	rules rules
	doc   string
}

type fieldSet struct {
	list   []field
	byName map[string]field
	names  []string
}

var fieldCache sync.Map // reflect.Type → fieldSet

func fieldsOf(t reflect.Type) fieldSet {
	if v, ok := fieldCache.Load(t); ok {
		return v.(fieldSet)
	}
	fs := fieldSet{byName: map[string]field{}}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		f := field{name: name, index: i, typ: sf.Type, rules: parseRules(sf.Tag.Get("spec")), doc: sf.Tag.Get("doc")}
		fs.list = append(fs.list, f)
		fs.byName[name] = f
		fs.names = append(fs.names, name)
	}
	fieldCache.Store(t, fs)
	return fs
}

// Validate checks every field of s against its rules and the rules that
// join fields, and returns Problems listing all that fail.
func (s *JobSpec) Validate() error {
	var ps Problems
	validateStruct(reflect.ValueOf(s).Elem(), "", &ps)
	ps = append(ps, s.crossChecks()...)
	ps = append(ps, findSecrets(reflect.ValueOf(s).Elem(), "")...)
	if len(ps) > 0 {
		return ps
	}
	return nil
}

func validateStruct(v reflect.Value, path string, ps *Problems) {
	for _, f := range fieldsOf(v.Type()).list {
		fv := v.Field(f.index)
		p := joinPath(path, f.name)
		if f.typ.Kind() == reflect.Struct {
			validateStruct(fv, p, ps)
			continue
		}
		if msg := checkValue(fv, f.rules); msg != "" {
			*ps = append(*ps, Problem{Path: p, Message: msg})
		}
	}
}

func checkValue(v reflect.Value, r rules) string {
	if v.Type() == durationType {
		return checkDuration(time.Duration(v.Int()), r)
	}
	switch v.Kind() {
	case reflect.String:
		return checkString(v.String(), r)
	case reflect.Int:
		return checkNumber(float64(v.Int()), strconv.FormatInt(v.Int(), 10), r)
	case reflect.Float64:
		return checkNumber(v.Float(), strconv.FormatFloat(v.Float(), 'g', -1, 64), r)
	}
	return ""
}

func checkString(s string, r rules) string {
	if s == "" {
		switch {
		case r.required:
			return "is required" + allowedSuffix(r)
		case r.optional:
			return ""
		default:
			return "must not be empty" + allowedSuffix(r)
		}
	}
	if r.max != "" {
		if n, _ := strconv.Atoi(r.max); len(s) > n {
			return fmt.Sprintf("is %d characters long (at most %d)", len(s), n)
		}
	}
	if len(r.enum) > 0 {
		for _, e := range r.enum {
			if s == e {
				return ""
			}
		}
		return fmt.Sprintf("%s is not allowed (allowed: %s)", quote(s), strings.Join(r.enum, ", "))
	}
	if r.kind != "" {
		k, ok := kinds[r.kind]
		if !ok {
			panic("spec: unknown kind " + r.kind)
		}
		if msg := k.check(s); msg != "" {
			return fmt.Sprintf("%s %s (%s)", quote(s), msg, k.allowed)
		}
	}
	return ""
}

func allowedSuffix(r rules) string {
	if len(r.enum) > 0 {
		return " (allowed: " + strings.Join(r.enum, ", ") + ")"
	}
	if k, ok := kinds[r.kind]; ok {
		return " (" + k.allowed + ")"
	}
	return ""
}

func checkNumber(x float64, text string, r rules) string {
	lo, hi := r.min, r.max
	rangeText := func() string {
		switch {
		case r.gt != "" && hi != "":
			return fmt.Sprintf("greater than %s and at most %s", r.gt, hi)
		case lo != "" && hi != "":
			return fmt.Sprintf("from %s to %s", lo, hi)
		case lo != "":
			return "at least " + lo
		case hi != "":
			return "at most " + hi
		}
		return ""
	}
	if r.gt != "" {
		if g, _ := strconv.ParseFloat(r.gt, 64); x <= g {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	if lo != "" {
		if m, _ := strconv.ParseFloat(lo, 64); x < m {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	if hi != "" {
		if m, _ := strconv.ParseFloat(hi, 64); x > m {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	return ""
}

func checkDuration(d time.Duration, r rules) string {
	const allowed = "a duration such as 30m or 24h"
	if d < 0 {
		return "is not a duration (" + allowed + ")"
	}
	lo, _ := time.ParseDuration(r.min)
	hi, _ := time.ParseDuration(r.max)
	if d < lo || d > hi {
		return fmt.Sprintf("%s is out of range (allowed: from %s to %s)", d, r.min, r.max)
	}
	return ""
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}

// crossChecks are the rules that join several fields.
func (s *JobSpec) crossChecks() Problems {
	var ps Problems
	w := s.Cluster.Workers
	if w.MinReplicas > w.Replicas {
		ps = append(ps, Problem{Path: "cluster.workers.minReplicas", Message: fmt.Sprintf("%d is more than replicas %d (allowed: at most replicas)", w.MinReplicas, w.Replicas)})
	}
	if w.Replicas > w.MaxReplicas {
		ps = append(ps, Problem{Path: "cluster.workers.replicas", Message: fmt.Sprintf("%d is more than maxReplicas %d (allowed: at most maxReplicas)", w.Replicas, w.MaxReplicas)})
	}
	if capacity := w.Replicas * w.GPUs; s.Training.Workers > capacity {
		ps = append(ps, Problem{Path: "training.workers", Message: fmt.Sprintf("%d workers need %d GPUs but the cluster has %d (replicas %d × gpus %d) (allowed: at most %d)", s.Training.Workers, s.Training.Workers, capacity, w.Replicas, w.GPUs, capacity)})
	}
	if s.Limits.StartDeadline > s.Limits.Deadline && s.Limits.Deadline > 0 {
		ps = append(ps, Problem{Path: "limits.startDeadline", Message: fmt.Sprintf("%s is longer than deadline %s (allowed: at most the deadline)", time.Duration(s.Limits.StartDeadline), time.Duration(s.Limits.Deadline))})
	}
	return ps
}
