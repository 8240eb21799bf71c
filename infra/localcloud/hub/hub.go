// Package hub is the local cloud's Hugging Face Hub: the two requests the
// pipeline and the trainer's stand-in make of the real one, answered for
// the model repositories it holds, on 127.0.0.1.
//
//   - GET /api/models/<repo>/revision/<rev>: the commit of a revision
//     (main, or the commit itself) and the repository's files, as the Hub's
//     model info (sha, siblings);
//   - GET /<repo>/resolve/<rev>/<path>: a file, with the X-Repo-Commit and
//     ETag headers the Hub sends.
//
// Simulated: the local cloud cannot reach the Hub. Each repository holds
// one commit, a stand-in snapshot (Snapshot): the tiny Gemma 3's config
// from the trainer's tests (trainer/tests/tiny.py) and weights of random
// bytes in the safetensors layout. No Python loads them in the local
// cloud; they are what the staging copies and counts. Every file served
// is counted (Downloads), so a test can tell how often a snapshot was
// copied from the Hub.
package hub

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Hub serves model repositories.
type Hub struct {
	mu        sync.Mutex
	repos     map[string]repo
	downloads map[string]int // "<repo>/<path>" -> files served
	srv       *http.Server
	addr      string
}

type repo struct {
	commit string
	files  map[string][]byte
}

// Snapshot is the stand-in snapshot of a model repository: the tiny Gemma
// 3's config.json, model.safetensors of seeded random bytes (size bytes of
// weights) and a generation_config.json.
func Snapshot(name string, size int) map[string][]byte {
	cfg := map[string]any{
		"architectures": []string{"Gemma3ForConditionalGeneration"}, "model_type": "gemma3",
		"mm_tokens_per_image": 4, "boi_token_index": 5, "eoi_token_index": 6, "image_token_index": 7,
		"text_config": map[string]any{"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
			"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
		"vision_config": map[string]any{"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
			"num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 8, "image_size": 32},
		"_name_or_path": name,
	}
	c, _ := json.MarshalIndent(cfg, "", "  ")
	return map[string][]byte{
		"config.json":            c,
		"generation_config.json": []byte(`{"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}`),
		"model.safetensors":      safetensors(name, size),
	}
}

// safetensors is one F32 tensor of n/4 seeded random values in the
// safetensors layout: the header's length (8 bytes, little-endian), the
// JSON header, the data.
func safetensors(seed string, n int) []byte {
	n -= n % 4
	head, _ := json.Marshal(map[string]any{"stand_in.weight": map[string]any{"dtype": "F32", "shape": []int{n / 4}, "data_offsets": []int{0, n}}})
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(head)))
	out = append(out, head...)
	h := sha256.Sum256([]byte(seed))
	r := rand.New(rand.NewChaCha8(h))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return append(out, data...)
}

// Commit is the commit a repository's snapshot is served at: derived
// from its files, as a git commit is from its tree.
func Commit(files map[string][]byte) string {
	h := sha1.New()
	for _, n := range sortedNames(files) {
		fmt.Fprintf(h, "%s %d\n", n, len(files[n]))
		h.Write(files[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Start serves the repositories (id -> files) on 127.0.0.1.
func Start(repos map[string]map[string][]byte) (*Hub, error) {
	h := &Hub{repos: map[string]repo{}, downloads: map[string]int{}}
	for id, files := range repos {
		h.repos[id] = repo{commit: Commit(files), files: files}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h.addr = ln.Addr().String()
	h.srv = &http.Server{Handler: h}
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

// URL is the endpoint (RAYDROP_HF_ENDPOINT, HF_ENDPOINT).
func (h *Hub) URL() string { return "http://" + h.addr }

// Close stops serving.
func (h *Hub) Close() error { return h.srv.Close() }

// CommitOf is the commit repo is served at, "" for one the hub lacks.
func (h *Hub) CommitOf(id string) string { return h.repos[id].commit }

// Downloads is how many times each file of repo was served.
func (h *Hub) Downloads(id string) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for k, n := range h.downloads {
		if p, ok := strings.CutPrefix(k, id+"/"); ok {
			out[p] = n
		}
	}
	return out
}

func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api/models/"); ok {
		id, rev, ok := strings.Cut(rest, "/revision/")
		rp, found := h.find(id, rev)
		if !ok || !found {
			notFound(w, id)
			return
		}
		var siblings []map[string]string
		for _, n := range sortedNames(rp.files) {
			siblings = append(siblings, map[string]string{"rfilename": n})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "modelId": id, "sha": rp.commit, "siblings": siblings})
		return
	}
	id, rest, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/resolve/")
	rev, path, ok2 := strings.Cut(rest, "/")
	rp, found := h.find(id, rev)
	body, has := rp.files[path]
	if !ok || !ok2 || !found || !has {
		notFound(w, id)
		return
	}
	if r.Method == http.MethodGet {
		h.mu.Lock()
		h.downloads[id+"/"+path]++
		h.mu.Unlock()
	}
	sum := sha256.Sum256(body)
	w.Header().Set("X-Repo-Commit", rp.commit)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

// find is repository id at rev: main or its commit.
func (h *Hub) find(id, rev string) (repo, bool) {
	rp, ok := h.repos[id]
	return rp, ok && (rev == "main" || rev == rp.commit)
}

func notFound(w http.ResponseWriter, id string) {
	w.Header().Set("X-Error-Code", "RepoNotFound")
	http.Error(w, fmt.Sprintf(`{"error":"Repository Not Found for url: %s"}`, id), http.StatusNotFound)
}

func sortedNames(files map[string][]byte) []string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
