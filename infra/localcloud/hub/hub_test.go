package hub_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/infra/localcloud/hub"
	"github.com/raydrop/raydrop/pkg/weights"
)

// TestHubAnswersAsTheHubDoes: the pipeline's own Hub client resolves a
// revision (main, or the commit) to the commit and files, a file comes
// with the Hub's headers and is counted, byte ranges are served, and an
// unknown repository or revision is the Hub's 404.
func TestHubAnswersAsTheHubDoes(t *testing.T) {
	files := hub.Snapshot("google/gemma-3-4b-it", 4096)
	h, err := hub.Start(hub.Repos{Models: map[string]map[string][]byte{"google/gemma-3-4b-it": files}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	ctx := context.Background()
	c := weights.Hub{Endpoint: h.URL()}
	commit := hub.Commit(files)
	for _, rev := range []string{"", "main", commit} {
		r, err := c.Resolve(ctx, "google/gemma-3-4b-it", rev)
		if err != nil || r.Commit != commit || len(r.Files) != len(files) {
			t.Errorf("revision %q: %+v, %v", rev, r, err)
		}
	}
	for _, bad := range [][2]string{{"google/nope", "main"}, {"google/gemma-3-4b-it", "v9"}} {
		if _, err := c.Resolve(ctx, bad[0], bad[1]); !weights.IsPermanent(err) {
			t.Errorf("%s@%s: %v, want the Hub's 404", bad[0], bad[1], err)
		}
	}
	url := h.URL() + "/google/gemma-3-4b-it/resolve/" + commit + "/model.safetensors"
	body, resp := get(t, url, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Repo-Commit") != commit || string(body) != string(files["model.safetensors"]) {
		t.Errorf("file: %d, commit %q, %d bytes", resp.StatusCode, resp.Header.Get("X-Repo-Commit"), len(body))
	}
	// The weights are in the safetensors layout: an 8-byte header length,
	// then the JSON header, then the data.
	if n := int(body[0]) | int(body[1])<<8; len(body) != 8+n+4096 {
		t.Errorf("model.safetensors is %d bytes with a header of %d", len(body), n)
	}
	part, resp := get(t, url, http.Header{"Range": {"bytes=2-9"}})
	if resp.StatusCode != http.StatusPartialContent || string(part) != string(files["model.safetensors"][2:10]) {
		t.Errorf("range: %d, %q", resp.StatusCode, part)
	}
	if got := h.Downloads("google/gemma-3-4b-it"); got["model.safetensors"] != 2 || len(got) != 1 {
		t.Errorf("downloads %v, want model.safetensors twice", got)
	}
}

// TestHubListsAndGates: the tree and paths-info listings, and a gated
// dataset's files refused without its token (401) and with another (403),
// with the error codes huggingface_hub reads.
func TestHubListsAndGates(t *testing.T) {
	files := hub.TutorialDataset()
	h, err := hub.Start(hub.Repos{Datasets: map[string]map[string][]byte{"a/open": files, "a/gated": files}, Gated: map[string]string{"datasets/a/gated": "hf_yes"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	var top, all []map[string]any
	getJSON(t, h.URL()+"/api/datasets/a/open/tree/main", &top)
	getJSON(t, h.URL()+"/api/datasets/a/open/tree/main?recursive=true", &all)
	if names(top) != "README.md data" || names(all) != "README.md data data/train-00000-of-00001.parquet" {
		t.Errorf("tree: %q, recursive %q", names(top), names(all))
	}
	if lfs, _ := all[2]["lfs"].(map[string]any); lfs == nil || int(lfs["size"].(float64)) != len(files["data/train-00000-of-00001.parquet"]) {
		t.Errorf("the Parquet file's entry has no LFS size: %v", all[2])
	}
	resp, err := http.PostForm(h.URL()+"/api/datasets/a/open/paths-info/main", map[string][]string{"paths": {"README.md", "data", "nope"}})
	if err != nil {
		t.Fatal(err)
	}
	var info []map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&info)
	_ = resp.Body.Close()
	if names(info) != "README.md data" {
		t.Errorf("paths-info: %q", names(info))
	}
	url := h.URL() + "/datasets/a/gated/resolve/main/README.md"
	for token, want := range map[string]int{"": 401, "hf_no": 403, "hf_yes": 200} {
		hd := http.Header{}
		if token != "" {
			hd.Set("Authorization", "Bearer "+token)
		}
		if _, resp := get(t, url, hd); resp.StatusCode != want || (want != 200 && resp.Header.Get("X-Error-Code") != "GatedRepo") {
			t.Errorf("token %q: %d %q, want %d", token, resp.StatusCode, resp.Header.Get("X-Error-Code"), want)
		}
	}
}

// TestLibrariesLoadFromIt: the trainer's own libraries, pointed at the
// local Hub by HF_ENDPOINT, load the tutorial-shaped dataset (by branch
// and by commit) with datasets.load_dataset, load a model's config and
// processor with transformers, and list its files with HfFileSystem; a
// revision that does not exist and a gated dataset without a token fail
// as they fail against the Hub, and HfApi.auth_check tells a token that
// may read a gated dataset from none.
func TestLibrariesLoadFromIt(t *testing.T) {
	python := os.Getenv("RAYDROP_TRAINER_PYTHON")
	if python == "" {
		t.Fatal("RAYDROP_TRAINER_PYTHON is not set: run the tests through make (make test), which builds the trainer's virtualenv")
	}
	data := hub.TutorialDataset()
	model := hub.Snapshot("google/gemma-3-4b-it", 1024)
	h, err := hub.Start(hub.Repos{
		Models:   map[string]map[string][]byte{"google/gemma-3-4b-it": model},
		Datasets: map[string]map[string][]byte{hub.TutorialDatasetID: data, "a/gated": data},
		Gated:    map[string]string{"datasets/a/gated": "hf_yes"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	cmd := exec.Command(python, "-c", librariesScript, hub.TutorialDatasetID, h.DatasetCommit(hub.TutorialDatasetID), h.CommitOf("google/gemma-3-4b-it"))
	cmd.Env = append(os.Environ(), "HF_ENDPOINT="+h.URL(), "HF_HOME="+t.TempDir(), "HF_HUB_DISABLE_TELEMETRY=1", "HF_HUB_OFFLINE=0",
		"HF_DATASETS_OFFLINE=0", "TRANSFORMERS_OFFLINE=0", "HF_TOKEN=", "TOKENIZERS_PARALLELISM=false", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("the script's last line is not its JSON: %v\n%s", err, out)
	}
	want := map[string]any{
		"rows": 48.0, "rowsByCommit": 48.0, "columns": 14.0, "image": "PNG", "processor": "Gemma3Processor",
		"architectures": "Gemma3ForConditionalGeneration", "files": float64(len(model)),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k, want := range map[string]string{
		"badRevision":     "RevisionNotFoundError",
		"gated":           "DatasetNotFoundError: Dataset 'a/gated' is a gated dataset on the Hub. You must be authenticated to access it.",
		"gatedCheck":      "GatedRepoError",
		"gatedCheckToken": "no error",
	} {
		if s, _ := got[k].(string); !strings.HasPrefix(s, want) {
			t.Errorf("%s: %q, want %q", k, s, want)
		}
	}
}

const librariesScript = `
import json, sys
import datasets
from huggingface_hub import HfApi, HfFileSystem
from transformers import AutoConfig, AutoProcessor

ds_id, ds_commit, model_commit = sys.argv[1:4]
out = {}
ds = datasets.load_dataset(ds_id, split="train")
out["rows"], out["columns"] = len(ds), len(ds.column_names)
out["image"] = ds[0]["image"].format
out["rowsByCommit"] = len(datasets.load_dataset(ds_id, split="train", revision=ds_commit))
def error(call):
    try:
        call()
        return "no error"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
out["badRevision"] = error(lambda: HfApi().dataset_info(ds_id, revision="v9"))
out["gated"] = error(lambda: datasets.load_dataset("a/gated", split="train"))
out["gatedCheck"] = error(lambda: HfApi().auth_check("a/gated", repo_type="dataset"))
out["gatedCheckToken"] = error(lambda: HfApi(token="hf_yes").auth_check("a/gated", repo_type="dataset"))
out["processor"] = type(AutoProcessor.from_pretrained("google/gemma-3-4b-it", use_fast=True)).__name__
out["architectures"] = ",".join(AutoConfig.from_pretrained("google/gemma-3-4b-it").architectures or [])
out["files"] = len(HfFileSystem().ls(f"google/gemma-3-4b-it@{model_commit}", detail=False))
print(json.dumps(out))
`

// reply is an answer's status and headers.
type reply struct {
	StatusCode int
	Header     http.Header
}

func get(t *testing.T, url string, h http.Header) ([]byte, reply) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return body, reply{resp.StatusCode, resp.Header}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	body, resp := get(t, url, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatal(err)
	}
}

func names(entries []map[string]any) string {
	var out []string
	for _, e := range entries {
		out = append(out, e["path"].(string))
	}
	return strings.Join(out, " ")
}
