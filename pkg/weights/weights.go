// Package weights is where a base model's weights are staged: the layout
// of a staged snapshot in the deployment's bucket, which the pipeline, the
// trainer (trainer/weights.py) and the local cloud's stand-in all follow,
// and the Hugging Face Hub's answer to which commit a revision is.
//
// A model revision is staged once: the first run that needs it copies the
// Hub's snapshot at a commit into <root>/<repo>/<commit>/ and writes the
// marker last; every later run, and every node of it, reads that copy.
package weights

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
)

const (
	// MarkerName is the object written last under a staged revision: its
	// presence means every file it lists is there.
	MarkerName = "raydrop-staged.json"
	// HeartbeatName is rewritten by the run that stages while it copies, so
	// that a run waiting for the copy can tell a slow copy from a dead one.
	HeartbeatName = "raydrop-heartbeat.json"
	// DefaultHubEndpoint is the Hugging Face Hub.
	DefaultHubEndpoint = "https://huggingface.co"
)

// Marker is the staged revision's record (MarkerName).
type Marker struct {
	Repo     string    `json:"repo"`
	Commit   string    `json:"commit"`
	Files    []File    `json:"files"`
	StagedBy string    `json:"stagedBy"`
	StagedAt time.Time `json:"stagedAt"`
	Seconds  float64   `json:"seconds"`
}

// File is one file of a staged snapshot, at its path in the repository.
type File struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Bytes is the snapshot's size.
func (m *Marker) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Location is a staged revision's folder in a bucket.
type Location struct {
	Bucket string
	Prefix string // <root prefix>/<repo>/<commit>, no trailing slash
}

// CommitRe is a Hub commit: 40 hexadecimal digits.
var CommitRe = regexp.MustCompile(`^[0-9a-f]{40}$`)

// At is where repo's commit is staged under root (gs://bucket[/prefix]).
func At(root, repo, commit string) (Location, error) {
	rest, ok := strings.CutPrefix(root, "gs://")
	bucket, prefix, _ := strings.Cut(rest, "/")
	if !ok || bucket == "" {
		return Location{}, fmt.Errorf("staging root %q is not gs://bucket[/prefix]", root)
	}
	if !CommitRe.MatchString(commit) {
		return Location{}, fmt.Errorf("%q is not a Hub commit (40 hexadecimal digits)", commit)
	}
	if repo == "" || strings.Contains(repo, "..") || strings.HasPrefix(repo, "/") {
		return Location{}, fmt.Errorf("%q is not a Hub repository id", repo)
	}
	p := strings.Trim(prefix, "/")
	if p != "" {
		p += "/"
	}
	return Location{Bucket: bucket, Prefix: p + repo + "/" + commit}, nil
}

// URI is the folder as the trainer takes it (--staged-model).
func (l Location) URI() string { return "gs://" + l.Bucket + "/" + l.Prefix }

// Object is the name of the object at path under the folder.
func (l Location) Object(path string) string { return l.Prefix + "/" + path }

// Hub asks the Hugging Face Hub (or a server that answers as it does)
// which commit a model revision is.
type Hub struct {
	Endpoint string // DefaultHubEndpoint when empty
	Token    string // a Hub token, for private and gated repositories
	Client   *http.Client
}

// Revision is a model revision as the Hub resolves it.
type Revision struct {
	Commit string
	Files  []string // the repository's files at that commit
}

// HubError is the Hub's refusal to say what a revision is.
type HubError struct {
	Repo, Revision string
	Status         int
	Body           string
}

func (e *HubError) Error() string {
	why := "answers " + http.StatusText(e.Status)
	switch e.Status {
	case http.StatusNotFound:
		why = "has no such model repository or revision (or it is private, and the deployment's Hub token cannot read it)"
	case http.StatusUnauthorized, http.StatusForbidden:
		why = "refuses the deployment's Hub token for it (a gated model whose terms the token's account has not accepted, a private one, or no token set: HF_TOKEN)"
	}
	return fmt.Sprintf("model.id %q at revision %q: the Hugging Face Hub %s (HTTP %d%s)", e.Repo, e.Revision, why, e.Status, bodyNote(e.Body))
}

func bodyNote(b string) string {
	if b = strings.TrimSpace(b); b == "" {
		return ""
	}
	if len(b) > 200 {
		b = b[:200] + "…"
	}
	return ": " + b
}

// Permanent says whether asking again cannot help: the Hub has no such
// revision, or refuses the token. Other answers (5xx, 429) are worth
// another try.
func (e *HubError) Permanent() bool {
	return e.Status == http.StatusNotFound || e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden || e.Status == http.StatusBadRequest
}

// Resolve is the commit of repo's revision ("" is the default branch,
// main) and the files at it, from GET /api/models/{repo}/revision/{rev}.
func (h Hub) Resolve(ctx context.Context, repo, revision string) (Revision, error) {
	rev := revision
	if rev == "" {
		rev = "main"
	}
	body, err := h.get(ctx, http.MethodGet, "/api/models/"+repo+"/revision/"+url.PathEscape(rev), repo, rev, 8<<20)
	if err != nil {
		return Revision{}, err
	}
	var info struct {
		SHA      string `json:"sha"`
		Siblings []struct {
			Name string `json:"rfilename"`
		} `json:"siblings"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return Revision{}, fmt.Errorf("the Hugging Face Hub's answer for %s@%s is not model info: %w", repo, rev, err)
	}
	if !CommitRe.MatchString(info.SHA) {
		return Revision{}, fmt.Errorf("the Hugging Face Hub's answer for %s@%s names no commit (sha %q)", repo, rev, info.SHA)
	}
	out := Revision{Commit: info.SHA}
	for _, s := range info.Siblings {
		out.Files = append(out.Files, s.Name)
	}
	return out, nil
}

// CanRead says whether the Hub lets the token read path of repo at commit
// (a HEAD of its resolve URL): a HubError when it refuses. A gated model
// lists to anyone, and refuses its files to an account that has not
// accepted its terms.
func (h Hub) CanRead(ctx context.Context, repo, commit, path string) error {
	_, err := h.get(ctx, http.MethodHead, "/"+repo+"/resolve/"+commit+"/"+path, repo, commit, 0)
	return err
}

// File is path of repo at commit, read whole (up to limit bytes): for small
// files; the trainer streams the weights themselves.
func (h Hub) File(ctx context.Context, repo, commit, path string, limit int64) ([]byte, error) {
	return h.get(ctx, http.MethodGet, "/"+repo+"/resolve/"+commit+"/"+path, repo, commit, limit)
}

// get sends method to path on the Hub with the token and returns the body
// (up to limit bytes); an answer other than 2xx is a HubError about repo
// at rev, carrying the body or the Hub's X-Error-Message.
func (h Hub) get(ctx context.Context, method, path, repo, rev string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, h.endpoint()+path, nil)
	if err != nil {
		return nil, err
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking the Hugging Face Hub for %s@%s: %w", repo, rev, err)
	}
	defer func() { _ = resp.Body.Close() }() // read-only: nothing to lose
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("reading the Hugging Face Hub's answer for %s@%s: %w", repo, rev, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		why := string(body)
		if msg := resp.Header.Get("X-Error-Message"); msg != "" {
			why = msg
		}
		return nil, &HubError{Repo: repo, Revision: rev, Status: resp.StatusCode, Body: why}
	}
	return body, nil
}

func (h Hub) endpoint() string {
	if e := strings.TrimSuffix(h.Endpoint, "/"); e != "" {
		return e
	}
	return DefaultHubEndpoint
}

func (h Hub) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return &http.Client{Timeout: 30 * time.Second}
}

// IsPermanent says whether err is the Hub's permanent refusal.
func IsPermanent(err error) bool {
	var he *HubError
	return errors.As(err, &he) && he.Permanent()
}
