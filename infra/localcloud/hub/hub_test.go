package hub_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/raydrop/raydrop/infra/localcloud/hub"
	"github.com/raydrop/raydrop/pkg/weights"
)

// TestHubAnswersAsTheHubDoes: the pipeline's own Hub client resolves a
// revision (main, or the commit) to the commit and files, a file comes
// with the Hub's headers and is counted, and an unknown repository or
// revision is the Hub's 404.
func TestHubAnswersAsTheHubDoes(t *testing.T) {
	files := hub.Snapshot("google/gemma-3-4b-it", 4096)
	h, err := hub.Start(map[string]map[string][]byte{"google/gemma-3-4b-it": files})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	ctx := context.Background()
	c := weights.Hub{Endpoint: h.URL()}
	commit := hub.Commit(files)
	for _, rev := range []string{"", "main", commit} {
		r, err := c.Resolve(ctx, "google/gemma-3-4b-it", rev)
		if err != nil || r.Commit != commit || len(r.Files) != 3 {
			t.Errorf("revision %q: %+v, %v", rev, r, err)
		}
	}
	for _, bad := range [][2]string{{"google/nope", "main"}, {"google/gemma-3-4b-it", "v9"}} {
		if _, err := c.Resolve(ctx, bad[0], bad[1]); !weights.IsPermanent(err) {
			t.Errorf("%s@%s: %v, want the Hub's 404", bad[0], bad[1], err)
		}
	}
	resp, err := http.Get(h.URL() + "/google/gemma-3-4b-it/resolve/" + commit + "/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Repo-Commit") != commit || string(body) != string(files["model.safetensors"]) {
		t.Errorf("file: %d, commit %q, %d bytes", resp.StatusCode, resp.Header.Get("X-Repo-Commit"), len(body))
	}
	// The weights are in the safetensors layout: an 8-byte header length,
	// then the JSON header, then the data.
	if n := int(body[0]) | int(body[1])<<8; len(body) != 8+n+4096 {
		t.Errorf("model.safetensors is %d bytes with a header of %d", len(body), n)
	}
	if got := h.Downloads("google/gemma-3-4b-it"); got["model.safetensors"] != 1 || len(got) != 1 {
		t.Errorf("downloads %v, want model.safetensors once", got)
	}
}
