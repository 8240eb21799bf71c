package pipeline_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestNoteStall: a suspected stall is recorded on its attempt and
// announced once per attempt, under an ID that names the attempt; a
// later suspicion of an attempt already retried changes nothing.
func TestNoteStall(t *testing.T) {
	w := pipelinetest.New(t)
	w.NewRun("r", w.Spec(nil), runs.Running, runs.Ending{})
	s := runs.Stall{SuspectedAt: w.Now, Step: 3, Since: w.Now.Add(-11 * time.Minute), Window: 10 * time.Minute}
	for range 2 {
		if _, err := w.Deps.NoteStall(w.Ctx, "r", 1, s); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.Events(); slices.Index(got, "r:stalled") != len(got)-1 || slices.Index(got, "r:stalled") < 0 {
		t.Fatalf("events %q, want one stalled, last", got)
	}
	ids := map[string]int{}
	for _, m := range w.Sent(w.Deps.Config.Topics.Events) {
		ids[m.Attrs["ce-id"]]++
	}
	if ids["r/stalled_1"] != 1 {
		t.Fatalf("event IDs %v, want r/stalled_1 once", ids)
	}
	if a := w.Record("r").CurrentAttempt(); a.Stall == nil || a.Stall.Step != 3 || !w.Record("r").WasPublished(runs.StallSuspected) {
		t.Fatalf("attempt %+v", a)
	}

	// The next attempt forgets the announcement; the old one's stall is
	// no longer current.
	if _, err := w.Deps.Runs.Update(w.Ctx, "r", func(r *runs.Record) error {
		return r.MarkProvisioned(runs.Attempt{N: 2}, "stalled", w.Now)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Deps.NoteStall(w.Ctx, "r", 1, s); err != nil {
		t.Fatal(err)
	}
	if w.Record("r").WasPublished(runs.StallSuspected) || w.Record("r").CurrentAttempt().Stall != nil {
		t.Fatal("attempt 1's stall reached attempt 2")
	}
	if _, err := w.Deps.Runs.Update(w.Ctx, "r", func(r *runs.Record) error {
		if err := r.MarkSubmitted(2, w.Now); err != nil {
			return err
		}
		return r.MarkRunning(2, w.Now)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Deps.NoteStall(w.Ctx, "r", 2, s); err != nil {
		t.Fatal(err)
	}
	ids = map[string]int{}
	for _, m := range w.Sent(w.Deps.Config.Topics.Events) {
		ids[m.Attrs["ce-id"]]++
	}
	if ids["r/stalled_1"] != 1 || ids["r/stalled_2"] != 1 {
		t.Fatalf("event IDs %v, want one stalled event per attempt", ids)
	}
}

// TestAwaitEvidence: a check whose own capture failed reads the folder
// another delivery is keeping, once its manifest is there, and the folder
// all the same when it never comes.
func TestAwaitEvidence(t *testing.T) {
	w := pipelinetest.New(t)
	rec := w.NewRun("r", w.Spec(nil), runs.Running, runs.Ending{})
	start := time.Now()
	uri := w.Deps.AwaitEvidence(w.Ctx, rec, 1, 1500*time.Millisecond)
	if waited := time.Since(start); !strings.HasSuffix(uri, "/r/evidence/") || waited < 1500*time.Millisecond {
		t.Fatalf("no manifest: %q after %s, want the folder after the wait", uri, waited)
	}
	bucket, folder, _ := strings.Cut(strings.TrimPrefix(uri, "gs://"), "/")
	w.Write(bucket, folder+"attempt-1/manifest.json", "{}")
	start = time.Now()
	if got := w.Deps.AwaitEvidence(w.Ctx, rec, 1, time.Minute); got != uri || time.Since(start) > 5*time.Second {
		t.Fatalf("with the manifest: %q after %s", got, time.Since(start))
	}
	if got := w.Deps.AwaitEvidence(w.Ctx, rec, 0, time.Minute); got != "" {
		t.Fatalf("no attempt: %q", got)
	}
}
