package weights

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const commit = "0123456789abcdef0123456789abcdef01234567"

// TestResolve: the Hub's model info gives the commit and files; its
// refusals are told apart from failures worth another try.
func TestResolve(t *testing.T) {
	var auth, path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth, path = r.Header.Get("Authorization"), r.URL.EscapedPath()
		switch {
		case strings.Contains(r.URL.Path, "/private/"):
			http.Error(w, "gated", http.StatusForbidden)
		case strings.Contains(r.URL.Path, "/busy/"):
			http.Error(w, "try later", http.StatusServiceUnavailable)
		case strings.Contains(r.URL.Path, "/odd/"):
			_, _ = w.Write([]byte(`{"sha":"main"}`))
		case strings.HasPrefix(r.URL.Path, "/api/models/google/gemma-3-4b-it/revision/"):
			_, _ = w.Write([]byte(`{"sha":"` + commit + `","siblings":[{"rfilename":"config.json"},{"rfilename":"model.safetensors"}]}`))
		default:
			http.Error(w, "Repository Not Found", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	h := Hub{Endpoint: srv.URL + "/", Token: "hf_x"}
	rev, err := h.Resolve(ctx, "google/gemma-3-4b-it", "refs/pr/1")
	if err != nil || rev.Commit != commit || strings.Join(rev.Files, ",") != "config.json,model.safetensors" {
		t.Fatalf("Resolve = %+v, %v", rev, err)
	}
	if auth != "Bearer hf_x" || path != "/api/models/google/gemma-3-4b-it/revision/refs%2Fpr%2F1" {
		t.Errorf("asked %s with %q", path, auth)
	}
	if _, err := (Hub{Endpoint: srv.URL}).Resolve(ctx, "google/gemma-3-4b-it", ""); err != nil || path != "/api/models/google/gemma-3-4b-it/revision/main" || auth != "" {
		t.Errorf("the default branch: asked %s with %q: %v", path, auth, err)
	}
	for repo, want := range map[string]struct {
		permanent bool
		says      string
	}{
		"google/nope": {true, `model.id "google/nope" at revision "main": the Hugging Face Hub has no such model repository or revision`},
		"x/private/m": {true, "refuses the deployment's Hub token"},
		"x/busy/m":    {false, "HTTP 503"},
		"x/odd/m":     {false, `names no commit (sha "main")`},
	} {
		_, err := h.Resolve(ctx, repo, "")
		if err == nil || IsPermanent(err) != want.permanent || !strings.Contains(err.Error(), want.says) {
			t.Errorf("%s: %v (permanent %v), want one saying %q, permanent %v", repo, err, IsPermanent(err), want.says, want.permanent)
		}
	}
}

// TestAt: a staged revision's folder, and what is not one.
func TestAt(t *testing.T) {
	l, err := At("gs://b/deploy/models", "google/gemma-3-4b-it", commit)
	if err != nil || l.URI() != "gs://b/deploy/models/google/gemma-3-4b-it/"+commit || l.Object(MarkerName) != "deploy/models/google/gemma-3-4b-it/"+commit+"/"+MarkerName {
		t.Errorf("At = %+v (%s), %v", l, l.URI(), err)
	}
	if l, err := At("gs://b", "g/m", commit); err != nil || l.Prefix != "g/m/"+commit {
		t.Errorf("a bucket's root: %+v, %v", l, err)
	}
	for _, c := range [][3]string{{"s3://b", "g/m", commit}, {"gs://b", "g/m", "main"}, {"gs://b", "../m", commit}, {"gs://", "g/m", commit}} {
		if _, err := At(c[0], c[1], c[2]); err == nil {
			t.Errorf("At(%q, %q, %q) took it", c[0], c[1], c[2])
		}
	}
}

// TestCanRead: a HEAD of a file's resolve URL, with the token; the Hub's
// refusal is a permanent HubError carrying its reason.
func TestCanRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodHead || r.URL.Path != "/google/gemma-3-4b-it/resolve/"+commit+"/config.json" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if r.Header.Get("Authorization") != "Bearer hf_ok" {
			w.Header().Set("X-Error-Message", "Access to model google/gemma-3-4b-it is restricted.")
			w.WriteHeader(http.StatusForbidden)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	if err := (Hub{Endpoint: srv.URL, Token: "hf_ok"}).CanRead(ctx, "google/gemma-3-4b-it", commit, "config.json"); err != nil {
		t.Errorf("an accepted token: %v", err)
	}
	err := (Hub{Endpoint: srv.URL, Token: "hf_no"}).CanRead(ctx, "google/gemma-3-4b-it", commit, "config.json")
	if !IsPermanent(err) || !strings.Contains(err.Error(), "HTTP 403: Access to model google/gemma-3-4b-it is restricted.") {
		t.Errorf("a refused token: %v", err)
	}
}
