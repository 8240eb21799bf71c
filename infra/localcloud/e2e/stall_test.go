package e2e_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/runs"
)

// waitStall waits for the run's current attempt to be suspected stalled
// and returns the suspicion.
func waitStall(t *testing.T, runID string, limit time.Duration) *runs.Stall {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if r, err := probe.Runs(st).Get(context.Background(), runID); err == nil && r.CurrentAttempt() != nil && r.CurrentAttempt().Stall != nil {
			return r.CurrentAttempt().Stall
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("run %s not suspected stalled within %s", runID, limit)
	return nil
}

// checkStalled checks a suspicion of a hang after step: within the window
// of limits.stallAfter 10s, and said at once in status and in one stalled
// event of the attempt.
func checkStalled(t *testing.T, runID string, s *runs.Stall, step int64) {
	t.Helper()
	if s.Step != step || s.Window != 10*time.Second || s.SuspectedAt.Sub(s.Since) <= s.Window || s.SuspectedAt.Sub(s.Since) > s.Window+15*time.Second {
		t.Errorf("stall %+v, want one suspected after step %d, within the 10s window and a tick or two", s, step)
	}
	if code, out, _ := raydrop("status", runID); code != 0 || !strings.Contains(out, "stalled") || !strings.Contains(out, "no progress since step") {
		t.Errorf("status: exit %d, no stall:\n%s", code, out)
	}
}

// TestStallFailsWithoutRestarts: a run that loads for longer than its
// stall window is not suspected; once it hangs after its first step, the
// monitor suspects a stall within the window and says so at once, asks
// every rank for its stacks and, with limits.stallRestarts 0, fails the
// run Stalled naming the rank the others waited for.
func TestStallFailsWithoutRestarts(t *testing.T) {
	t.Parallel()
	limits := map[string]any{"deadline": "5m", "startDeadline": "2m", "stallAfter": "10s", "stallRestarts": 0}
	runID := upload(t, "stallfail", specFor(t, "e2e-stallfail", map[string]any{"limits": limits}), "outcome=hang,at=2,step=200ms,weights=15s")
	checkStalled(t, runID, waitStall(t, runID, 90*time.Second), 1)
	r := waitPhase(t, runID, 120*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Failed || r.Reason != runs.Stalled || r.Attempt != 1 || !strings.Contains(r.Message, "(limits.stallRestarts 0)") {
		t.Fatalf("phase %s reason %s attempt %d %q; want FAILED Stalled on attempt 1", r.Phase, r.Reason, r.Attempt, r.Message)
	}
	if n := rayJobsOf(t, runID); n != 0 {
		t.Errorf("%d RayJobs left, want 0 (deleted)", n)
	}
	evs := eventsOf(t, runID)
	if count(evs, "stalled") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("%d stalled events, %d terminal; want 1 each: %+v", count(evs, "stalled"), terminalEvents(evs), evs)
	}
	for _, e := range evs {
		if e.Phase == "stalled" && (e.ID != runID+"/stalled_1" || e.Stall == nil || e.Stall.Step != 1 || e.Attempt != 1 || !strings.Contains(e.Message, "no progress since step 1")) {
			t.Errorf("stalled event %s: %+v", e.ID, e.Run)
		}
	}
	checkCause(t, runID, evs, "Stalled", "waited outside the collective the other ranks waited in")
	checkStacks(t, runID)
	waitNoWorkers(t, "e2e-stallfail")
}

// TestStallRestartsAndSucceeds: the attempt that hangs at step 3 is
// restarted once every rank's stacks are in, from its latest checkpoint
// (step 2), and the next attempt succeeds.
func TestStallRestartsAndSucceeds(t *testing.T) {
	t.Parallel()
	limits := map[string]any{"deadline": "5m", "startDeadline": "2m", "stallAfter": "10s"}
	runID := upload(t, "stallretry", specFor(t, "e2e-stallretry", map[string]any{"limits": limits}), "outcome=hang,at=3,hangs=1,steps=2,step=200ms")
	checkStalled(t, runID, waitStall(t, runID, 90*time.Second), 2)
	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Attempt != 2 {
		t.Fatalf("phase %s attempt %d (%s); want SUCCEEDED on attempt 2", r.Phase, r.Attempt, r.Message)
	}
	first, second := r.Attempts[0], r.Attempts[1]
	if first.Outcome != runs.OutcomeRetried || first.Reason != runs.Stalled || first.Cause == nil || first.Cause.Kind != "Stalled" || first.Stall == nil ||
		!strings.Contains(first.Message, "restart 1 of limits.stallRestarts 1") {
		t.Errorf("attempt 1: %+v, want retried as stalled", first)
	}
	if !strings.Contains(second.ResumeFrom, "attempt-1/") || !strings.Contains(second.ResumeFrom, "checkpoint_000000") || second.Stall != nil {
		t.Errorf("attempt 2 resumes from %q (stall %+v), want attempt 1's checkpoint of step 2", second.ResumeFrom, second.Stall)
	}
	evs := eventsOf(t, runID)
	if count(evs, "stalled") != 1 || count(evs, "succeeded") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v, want one stalled and one succeeded", evs)
	}
	// Attempt 1's stacks are in its evidence.
	if b, err := readEvidence(r, "attempt-1/stacks/rank-00000.txt"); err != nil || !strings.Contains(string(b), "in all_reduce") {
		t.Errorf("attempt 1's stacks of rank 0: %v\n%s", err, b)
	}
	waitNoWorkers(t, "e2e-stallretry")
}

// readEvidence reads name (relative to the run's evidence folder, as
// "attempt-1/stacks/rank-00000.txt") from the run's bucket.
func readEvidence(r *runs.Record, name string) ([]byte, error) {
	ctx := context.Background()
	cur, err := probe.Runs(st).Get(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	bucket, folder, ok := strings.Cut(strings.TrimPrefix(cur.Evidence, "gs://"), "/")
	if !ok {
		return nil, fmt.Errorf("run %s has no evidence folder (%q)", r.RunID, cur.Evidence)
	}
	rd, err := st.GCS.Bucket(bucket).Object(folder + name).NewReader(ctx)
	if err != nil {
		return nil, fmt.Errorf("gs://%s/%s%s: %w", bucket, folder, name, err)
	}
	defer func() { _ = rd.Close() }()
	return io.ReadAll(rd)
}
