// Package hub is the local cloud's Hugging Face Hub: the requests the
// pipeline, the trainer and the datasets library make of the real one,
// answered for the model and dataset repositories it holds, on 127.0.0.1.
//
//   - GET /api/{models,datasets}/<repo>[/revision/<rev>]: the commit of a
//     revision (main, or the commit itself) and the repository's files, as
//     the Hub's model or dataset info (sha, siblings, gated);
//   - GET /api/{models,datasets}/<repo>/tree/<rev>[/<path>]: a folder's
//     entries (?recursive=true: all below it), as the Hub lists them (type,
//     path, size, oid, and lfs for the files the Hub keeps in LFS);
//   - POST /api/{models,datasets}/<repo>/paths-info/<rev>: the entries of
//     the form's paths that exist;
//   - GET /api/{models,datasets}/<repo>/auth-check: whether the request's
//     token may read the repository's files;
//   - GET or HEAD /<repo>/resolve/<rev>/<path> (a model) and
//     /datasets/<repo>/resolve/<rev>/<path>: a file, byte ranges included,
//     with the X-Repo-Commit and ETag headers the Hub sends.
//
// The Hub's errors come with its X-Error-Code header, which
// huggingface_hub turns into its exceptions: RepoNotFound, RevisionNotFound,
// EntryNotFound (404) and GatedRepo (401 without a token, 403 with one the
// repository's terms were not accepted for). A gated repository's info and
// file list are public, as on the Hub; its files are not.
//
// Simulated: the local cloud cannot reach the Hub. Each repository holds
// one commit. A model is a stand-in snapshot (Snapshot): the tiny Gemma 3's
// config and processor from the trainer's tests (trainer/tests/tiny.py)
// and weights of random bytes in the safetensors layout; the data check
// loads its processor, nothing loads its weights. A dataset is the small
// dataset of the tutorial's shape in repos/ (TutorialDataset), Parquet as
// the Hub serves it. Every file served is counted (Downloads), so a test
// can tell how often a snapshot was copied from the Hub.
package hub

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kinds of repository, as the Hub's API paths name them.
const (
	Models   = "models"
	Datasets = "datasets"
)

// Repos is what a hub holds.
type Repos struct {
	Models   map[string]map[string][]byte // repository id -> files (path -> content)
	Datasets map[string]map[string][]byte
	// Gated maps "<kind>/<repo id>" to the one token whose account has
	// accepted the repository's terms; its files are refused to others.
	Gated map[string]string
}

// Hub serves model and dataset repositories.
type Hub struct {
	mu        sync.Mutex
	repos     map[string]repo // "<kind>/<id>"
	downloads map[string]int  // "<id>/<path>" -> files served
	srv       *http.Server
	addr      string
}

type repo struct {
	kind, id string
	commit   string
	files    map[string][]byte
	token    string // gated: the token that may read its files
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

// Start serves the repositories on 127.0.0.1.
func Start(r Repos) (*Hub, error) {
	h := &Hub{repos: map[string]repo{}, downloads: map[string]int{}}
	for kind, set := range map[string]map[string]map[string][]byte{Models: r.Models, Datasets: r.Datasets} {
		for id, files := range set {
			h.repos[kind+"/"+id] = repo{kind: kind, id: id, commit: Commit(files), files: files, token: r.Gated[kind+"/"+id]}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h.addr = ln.Addr().String()
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

// URL is the endpoint (RAYDROP_HF_ENDPOINT, HF_ENDPOINT).
func (h *Hub) URL() string { return "http://" + h.addr }

// Close stops serving.
func (h *Hub) Close() error { return h.srv.Close() }

// CommitOf is the commit a model repository is served at, "" for one the
// hub lacks.
func (h *Hub) CommitOf(id string) string { return h.repos[Models+"/"+id].commit }

// DatasetCommit is the commit a dataset repository is served at, "" for
// one the hub lacks.
func (h *Hub) DatasetCommit(id string) string { return h.repos[Datasets+"/"+id].commit }

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
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/api/"); ok {
		kind, rest, _ := strings.Cut(rest, "/")
		if kind != Models && kind != Datasets {
			hubError(w, http.StatusNotFound, "EntryNotFound", "no such API: "+p)
			return
		}
		h.api(w, r, kind, rest)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	kind, rest := Models, strings.TrimPrefix(p, "/")
	if after, ok := strings.CutPrefix(rest, Datasets+"/"); ok {
		kind, rest = Datasets, after
	}
	id, at, ok := strings.Cut(rest, "/resolve/")
	rev, file, ok2 := strings.Cut(at, "/")
	if !ok || !ok2 {
		hubError(w, http.StatusNotFound, "EntryNotFound", "no such page: "+p)
		return
	}
	rp, found := h.find(w, kind, id, rev)
	if !found || !h.admit(w, r, rp) {
		return
	}
	body, has := rp.files[file]
	if !has {
		hubError(w, http.StatusNotFound, "EntryNotFound", fmt.Sprintf("%s does not exist on %q", file, rev))
		return
	}
	if r.Method == http.MethodGet {
		h.mu.Lock()
		h.downloads[id+"/"+file]++
		h.mu.Unlock()
	}
	sum := sha256.Sum256(body)
	w.Header().Set("X-Repo-Commit", rp.commit)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

// api answers /api/<kind>/<rest>: the info, tree and paths-info requests.
func (h *Hub) api(w http.ResponseWriter, r *http.Request, kind, rest string) {
	var id, op, rev, sub string
	for _, o := range []string{"/revision/", "/tree/", "/paths-info/"} {
		if before, after, ok := strings.Cut(rest, o); ok {
			id, op = before, strings.Trim(o, "/")
			rev, sub, _ = strings.Cut(after, "/")
			break
		}
	}
	if op == "" {
		id, op, rev = rest, "revision", "main"
		if before, ok := strings.CutSuffix(rest, "/auth-check"); ok {
			id, op = before, "auth-check"
		}
	}
	if want := map[string]string{"revision": http.MethodGet, "auth-check": http.MethodGet, "tree": http.MethodGet, "paths-info": http.MethodPost}[op]; r.Method != want && (r.Method != http.MethodHead || want != http.MethodGet) {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rp, found := h.find(w, kind, id, rev)
	if !found {
		return
	}
	var out any
	switch op {
	case "auth-check":
		if !h.admit(w, r, rp) {
			return
		}
		out = map[string]any{}
	case "revision":
		out = rp.info()
	case "tree":
		entries, ok := rp.tree(sub, r.URL.Query().Get("recursive") == "true" || r.URL.Query().Get("recursive") == "True")
		if !ok {
			hubError(w, http.StatusNotFound, "EntryNotFound", fmt.Sprintf("%s does not exist on %q", sub, rev))
			return
		}
		out = entries
	case "paths-info":
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		entries := []map[string]any{}
		for _, q := range r.PostForm["paths"] {
			if e, ok := rp.entry(strings.Trim(q, "/")); ok {
				entries = append(entries, e)
			}
		}
		out = entries
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// find is repository id at rev (main, or its commit); false after
// answering the Hub's 404.
func (h *Hub) find(w http.ResponseWriter, kind, id, rev string) (repo, bool) {
	rp, ok := h.repos[kind+"/"+id]
	switch {
	case !ok:
		hubError(w, http.StatusNotFound, "RepoNotFound", fmt.Sprintf("Repository Not Found for url: %s/%s", kind, id))
	case rev != "main" && rev != rp.commit:
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
	default:
		return rp, true
	}
	return repo{}, false
}

// admit says whether r may read a file of rp: a gated repository's files
// need its token (Authorization: Bearer); false after answering the Hub's
// GatedRepo refusal.
func (h *Hub) admit(w http.ResponseWriter, r *http.Request, rp repo) bool {
	if rp.token == "" {
		return true
	}
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	what := strings.TrimSuffix(rp.kind, "s")
	switch token {
	case rp.token:
		return true
	case "":
		hubError(w, http.StatusUnauthorized, "GatedRepo", fmt.Sprintf("Access to %s %s is restricted. You must have access to it and be authenticated to access it. Please log in.", what, rp.id))
	default:
		hubError(w, http.StatusForbidden, "GatedRepo", fmt.Sprintf("Access to %s %s is restricted and you are not in the authorized list. Visit https://huggingface.co/%s to ask for access.", what, rp.id, rp.id))
	}
	return false
}

func (rp repo) info() map[string]any {
	siblings := []map[string]string{}
	for _, n := range sortedNames(rp.files) {
		siblings = append(siblings, map[string]string{"rfilename": n})
	}
	gated := any(false)
	if rp.token != "" {
		gated = "manual"
	}
	info := map[string]any{"_id": rp.commit[:24], "id": rp.id, "author": strings.Split(rp.id, "/")[0], "sha": rp.commit,
		"private": false, "gated": gated, "disabled": false, "tags": []string{}, "siblings": siblings,
		"lastModified": "2025-01-01T00:00:00.000Z", "createdAt": "2025-01-01T00:00:00.000Z"}
	if rp.kind == Models {
		info["modelId"] = rp.id
	}
	return info
}

// entry is one path's tree entry: a file, or a folder that holds files.
func (rp repo) entry(p string) (map[string]any, bool) {
	if body, ok := rp.files[p]; ok {
		sum := sha1.Sum(fmt.Appendf(nil, "blob %d\x00%s", len(body), body)) // git's blob id
		e := map[string]any{"type": "file", "path": p, "size": len(body), "oid": hex.EncodeToString(sum[:])}
		if lfs(p) {
			s := sha256.Sum256(body)
			e["lfs"] = map[string]any{"oid": hex.EncodeToString(s[:]), "size": len(body), "pointerSize": 134}
		}
		return e, true
	}
	for _, n := range sortedNames(rp.files) {
		if strings.HasPrefix(n, p+"/") {
			sum := sha1.Sum([]byte(rp.commit + "/" + p))
			return map[string]any{"type": "directory", "path": p, "size": 0, "oid": hex.EncodeToString(sum[:])}, true
		}
	}
	return nil, false
}

// tree is the entries in folder dir ("" the root): its files and folders,
// or everything below it.
func (rp repo) tree(dir string, recursive bool) ([]map[string]any, bool) {
	dir = strings.Trim(dir, "/")
	if dir != "" {
		if e, ok := rp.entry(dir); !ok || e["type"] != "directory" {
			return nil, false
		}
	}
	seen := map[string]bool{}
	out := []map[string]any{}
	for _, n := range sortedNames(rp.files) {
		rel := n
		if dir != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(n, dir+"/"); !ok {
				continue
			}
		}
		parts := strings.Split(rel, "/")
		if !recursive {
			parts = parts[:1]
		}
		for i := range parts {
			p := path.Join(dir, strings.Join(parts[:i+1], "/"))
			if seen[p] {
				continue
			}
			seen[p] = true
			e, _ := rp.entry(p)
			out = append(out, e)
		}
	}
	return out, true
}

// lfs says whether the Hub keeps a file in LFS: weights, Parquet, images
// and other binaries, as its default .gitattributes does.
func lfs(p string) bool {
	return slices.Contains([]string{".safetensors", ".bin", ".parquet", ".arrow", ".png", ".jpg", ".jpeg"}, path.Ext(p))
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("X-Error-Code", code)
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func sortedNames(files map[string][]byte) []string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
