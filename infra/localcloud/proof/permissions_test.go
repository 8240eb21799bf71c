package proof_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/runs"
)

// unreadableOutput is a checkpoint bucket the deployment lets runs write,
// but whose reads Cloud Storage refuses to Monitor and Finalize: a role the
// deployment forgot.
const unreadableOutput = "raydrop-proof-unreadable"

// testPermissions: a run whose results the functions may not read (403 on
// its bucket) still ends, FAILED with reason CheckpointsUnreadable and one
// terminal event, and its cluster's workers go to zero.
func testPermissions(t *testing.T) {
	t.Parallel()
	scenario := "permissions: checkpoints the functions may not read"
	for _, fn := range []string{"Monitor", "Finalize"} {
		st.DenyBucket(fn, unreadableOutput)
	}
	cluster := "unreadable"
	b, err := probe.Spec(example, cluster, unreadableOutput, nil)
	if err != nil {
		t.Fatal(err)
	}
	runID := upload(t, "unreadable", b, "")
	checkRun(t, scenario, runID, cluster, outcome{phase: runs.Failed})
	rec, err := probe.WaitPhase(context.Background(), st, runID, time.Second, probe.Ended...)
	if err == nil && rec.Reason != runs.CheckpointsUnreadable {
		msg := fmt.Sprintf("run %s ended %s with reason %s (%s), want CheckpointsUnreadable", runID, rec.Phase, rec.Reason, rec.Message)
		report.Add(scenario, 0, 0, msg)
		t.Error(msg)
	}
}
