package e2e_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/hub"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/weights"
)

// TestModelStagedOnce: two runs of a model nobody staged yet, dropped
// together, stage it once: one copies the snapshot from the (local) Hub
// into the checkpoint bucket, the other waits for its marker, and both
// name the commit and the run that staged it in their events. A run after
// them copies nothing. The model is one no other test trains, so that this
// test sees its first staging.
func TestModelStagedOnce(t *testing.T) {
	t.Parallel()
	const model = "google/gemma-3-12b-it"
	commit := st.Hub.CommitOf(model)
	if commit == "" {
		t.Fatalf("the local Hub does not hold %s", model)
	}
	ctx := context.Background()
	spec := func(cluster string) []byte {
		return specFor(t, cluster, map[string]any{"model": map[string]any{"id": model}})
	}
	first := []string{
		upload(t, "staged-a", spec("e2e-staged-a"), "steps=2,step=200ms"),
		upload(t, "staged-b", spec("e2e-staged-b"), "steps=2,step=200ms"),
	}
	uri := "gs://" + output + "/" + stack.ModelStagingPrefix + "/" + model + "/" + commit
	stagedBy := map[string]bool{}
	for _, id := range first {
		r := waitPhase(t, id, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
		if r.Phase != runs.Succeeded {
			t.Fatalf("%s: %s (%s)", id, r.Phase, r.Message)
		}
		m := r.Model
		if m == nil || m.Repo != model || m.Commit != commit || m.URI != uri || m.Revision != "main" {
			t.Fatalf("%s recorded model %+v; want %s@%s at %s", id, m, model, commit, uri)
		}
		stagedBy[m.StagedBy] = true
		for _, e := range eventsOf(t, id) {
			if e.Phase != "accepted" && e.Phase != "queued" && e.Phase != "provisioned" && (e.Model == nil || e.Model.Commit != commit || e.Model.StagedBy != m.StagedBy) {
				t.Errorf("%s's %s event names model %+v", id, e.Phase, e.Model)
			}
		}
	}
	if len(stagedBy) != 1 || !slices.Contains(first, firstKey(stagedBy)) {
		t.Errorf("the runs name %v as the run that staged the model; want one of %v", stagedBy, first)
	}
	// One copy from the Hub: each file served once, and one Ray job that
	// says it copied.
	want := map[string]int{}
	for f := range hub.Snapshot(model, 0) {
		want[f] = 1
	}
	if got := st.Hub.Downloads(model); !mapsEqual(got, want) {
		t.Errorf("files served by the Hub %v, want each once: %v", got, want)
	}
	if n := stagers(model); n != 1 {
		t.Errorf("%d Ray jobs copied %s from the Hub, want 1", n, model)
	}
	// The marker, written last, lists what was copied.
	var mk weights.Marker
	rd, err := st.GCS.Bucket(output).Object(stack.ModelStagingPrefix + "/" + model + "/" + commit + "/" + weights.MarkerName).NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rd.Close() }()
	if err := json.NewDecoder(rd).Decode(&mk); err != nil || mk.Commit != commit || len(mk.Files) != len(want) || !stagedBy[mk.StagedBy] {
		t.Errorf("marker %+v (%v)", mk, err)
	}

	later := upload(t, "staged-c", spec("e2e-staged-c"), "steps=2,step=200ms")
	r := waitPhase(t, later, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Model == nil || !r.Model.Staged || !stagedBy[r.Model.StagedBy] {
		t.Errorf("a later run: %s, model %+v; want it to read the staged copy", r.Phase, r.Model)
	}
	if got := st.Hub.Downloads(model); !mapsEqual(got, want) {
		t.Errorf("after a later run, files served by the Hub %v, want still %v", got, want)
	}
	t.Logf("%s@%s staged once by %s into %s (%d files, %d bytes, %.2f s)", model, commit[:12], mk.StagedBy, uri, len(mk.Files), mk.Bytes(), mk.Seconds)
}

// stagers counts the Ray jobs that copied model from the Hub.
func stagers(model string) int {
	n := 0
	for _, j := range st.Sim.Played() {
		if j.StagedModel && j.Args["model-id"] == model {
			n++
		}
	}
	return n
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
