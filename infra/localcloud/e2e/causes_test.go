package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
)

// TestFailureCauses plays each failure mode of the kubelet stand-in
// through the whole pipeline: the run ends with its cause in its record,
// its terminal event and raydrop status, raydrop diagnose shows the error
// line once the workers are gone, and the retry policy holds: a cause a
// retry may fix is retried once, and not into the same failure again.
func TestFailureCauses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, scenario string
		limits         map[string]any
		cause          string
		summary        string // in the cause's summary
		line           string // in raydrop diagnose
		reason         runs.Reason
		attempts       int
	}{
		{"cuda-oom", "outcome=cuda-oom,at=2,rank=9,step=150ms", nil, "CudaOutOfMemory", "CUDA out of memory", "Tried to allocate 4.50 GiB", runs.ApplicationError, 2},
		{"nccl-timeout", "outcome=nccl-timeout,at=2,rank=9,step=150ms", nil, "NcclTimeout", "an NCCL collective timed out", "Watchdog caught collective operation timeout", runs.InfrastructureFailure, 2},
		{"host-oom", "outcome=host-oom,at=2,rank=9,step=150ms", nil, "HostOutOfMemory", "its node ran low on memory", "Task was killed due to the node running low on memory", runs.ApplicationError, 2},
		{"oom-killed", "outcome=oom-killed,at=2,rank=9,step=150ms", nil, "OOMKilled", "killed at its memory limit (OOMKilled)", "reason OOMKilled", runs.ApplicationError, 2},
		{"image-pull", "outcome=image-pull", map[string]any{"limits": map[string]any{"startDeadline": "1m"}}, "ImagePull", "an image cannot be pulled", "ImagePullBackOff", runs.StartDeadlineExceeded, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cluster := "e2e-cause-" + tc.name
			runID := upload(t, "cause-"+tc.name, specFor(t, cluster, tc.limits), tc.scenario)
			r := waitPhase(t, runID, 180*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
			if r.Phase != runs.Failed || r.Reason != tc.reason || r.Attempt != tc.attempts {
				t.Fatalf("phase %s reason %s attempt %d (%s); want FAILED %s after %d attempt(s)", r.Phase, r.Reason, r.Attempt, r.Message, tc.reason, tc.attempts)
			}
			if tc.attempts > 1 {
				// The first attempt was retried for its cause, recorded on it.
				if a := r.Attempts[0]; a.Outcome != runs.OutcomeRetried || a.Cause == nil || a.Cause.Kind != tc.cause || !strings.Contains(a.Message, tc.cause) {
					t.Errorf("attempt 1: %s %s %q cause %+v; want retried for %s", a.Outcome, a.Reason, a.Message, a.Cause, tc.cause)
				}
			}
			checkCause(t, runID, eventsOf(t, runID), tc.cause, tc.summary)
			waitNoWorkers(t, cluster)
			checkDiagnose(t, runID, tc.cause, tc.line)
		})
	}
}
