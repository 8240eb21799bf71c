package kubesim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/weights"
)

// The staging of the base model, as trainer/weights.py's driver half does
// it before Ray Train starts: with --stage-model true, copy the snapshot
// at --model-revision from the Hub (Options.Hub, the local cloud's) into
// --staged-model, a heartbeat rewritten per file, the marker written last;
// with false, wait for another run's marker, and copy it itself if that
// run's heartbeat stops (the run died before its marker). Simulated: the copy is this
// Go code rather than the trainer's Python, byte for byte the same layout
// (pkg/weights). What the real workers do next, one copy per node onto
// local SSD, has no stand-in here: kubesim's pods run no container.

// awaitPoll and awaitStale are the waiting run's polling interval and how
// long it waits for a heartbeat that does not change before it copies the
// snapshot itself (the trainer's are 10 s and 10 minutes).
var (
	awaitPoll  = 250 * time.Millisecond
	awaitStale = 30 * time.Second
)

// stageModel plays the driver's staging step; an error is the trainer's
// exception text.
func (t *trainer) stageModel(ctx context.Context) error {
	uri := t.a.all["staged-model"]
	if uri == "" {
		return nil
	}
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(strings.TrimSuffix(uri, "/"), "gs://"), "/")
	commit := t.a.all["model-revision"]
	if t.a.all["stage-model"] != "true" {
		if staged, err := t.awaitStaged(ctx, bucket, prefix, uri); staged || err != nil {
			return err
		}
	}
	if _, err := t.st.get(ctx, bucket, prefix+"/"+weights.MarkerName); err == nil {
		t.logf("raydrop: %s is staged already", uri)
		return nil
	} else if !errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("OSError: reading %s/%s: %w", uri, weights.MarkerName, err)
	}
	start := time.Now()
	endpoint := t.p.d.sim.o.Hub
	rev, err := weights.Hub{Endpoint: endpoint}.Resolve(ctx, t.a.modelID, commit)
	if err != nil {
		return fmt.Errorf("huggingface_hub.errors.HfHubHTTPError: %w", err)
	}
	files := modelFiles(rev.Files)
	if !slices.ContainsFunc(files, func(f string) bool { return strings.HasSuffix(f, ".safetensors") || strings.HasSuffix(f, ".bin") }) {
		return fmt.Errorf("ValueError: %s@%s has no .safetensors or .bin weights at its root (files staged from it: %v); from_pretrained could not load a copy of it", t.a.modelID, commit, files)
	}
	mk := weights.Marker{Repo: t.a.modelID, Commit: commit, StagedBy: t.a.runID}
	var done int64
	for i, name := range files {
		beat := mustJSON(map[string]any{"run": t.a.runID, "at": time.Now().UTC().Format(time.RFC3339Nano), "files": i, "bytes": done})
		if err := t.st.put(ctx, bucket, prefix+"/"+weights.HeartbeatName, beat); err != nil {
			return fmt.Errorf("OSError: %w", err)
		}
		body, err := (weights.Hub{Endpoint: endpoint}).File(ctx, t.a.modelID, commit, name, 1<<30)
		if err != nil {
			return fmt.Errorf("huggingface_hub.errors.HfHubHTTPError: %w", err)
		}
		if err := t.st.put(ctx, bucket, prefix+"/"+name, body); err != nil {
			return fmt.Errorf("OSError: %w", err)
		}
		done += int64(len(body))
		mk.Files = append(mk.Files, weights.File{Path: name, Size: int64(len(body))})
	}
	mk.StagedAt, mk.Seconds = time.Now().UTC(), time.Since(start).Seconds()
	if err := t.st.put(ctx, bucket, prefix+"/"+weights.MarkerName, mustJSON(mk)); err != nil {
		return fmt.Errorf("OSError: %w", err)
	}
	t.logf("raydrop: staged %s@%s into %s: %d files, %d bytes in %.1f s", t.a.modelID, commit, uri, len(mk.Files), done, mk.Seconds)
	t.p.update(func(r *JobRecord) { r.StagedModel = true })
	return nil
}

// awaitStaged waits for another run's marker, as weights.await_staged:
// true once it is there, false when the staging run's heartbeat has not
// changed for awaitStale (this run then copies the snapshot itself).
func (t *trainer) awaitStaged(ctx context.Context, bucket, prefix, uri string) (bool, error) {
	var last []byte
	changed := time.Now()
	for {
		if _, err := t.st.get(ctx, bucket, prefix+"/"+weights.MarkerName); err == nil {
			t.logf("raydrop: %s is staged; the workers read it", uri)
			return true, nil
		}
		if beat, err := t.st.get(ctx, bucket, prefix+"/"+weights.HeartbeatName); err == nil && !bytes.Equal(beat, last) {
			last, changed = beat, time.Now()
		}
		if time.Since(changed) > awaitStale {
			t.logf("raydrop: %s: no marker, and the staging run's heartbeat has not changed for %s (last: %s); staging it here",
				uri, awaitStale, strings.TrimSpace(string(last)))
			return false, nil
		}
		if err := t.p.sleep(ctx, awaitPoll); err != nil {
			return false, err
		}
	}
}

// modelFiles are the files staged of a repository's (weights.model_files):
// those at its root with a suffix from_pretrained reads, and .bin weights
// only where there are no .safetensors.
func modelFiles(all []string) []string {
	suffixes := []string{".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken"}
	if !slices.ContainsFunc(all, func(f string) bool { return !strings.Contains(f, "/") && strings.HasSuffix(f, ".safetensors") }) {
		suffixes = append(suffixes, ".bin")
	}
	var out []string
	for _, f := range all {
		if strings.Contains(f, "/") || strings.HasPrefix(f, "raydrop-") {
			continue
		}
		if slices.ContainsFunc(suffixes, func(s string) bool { return strings.HasSuffix(f, s) }) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}
