package proof_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/runs"
)

// tieredSpec is the example on cluster with the capacity tiers and limits
// given.
func tieredSpec(t *testing.T, cluster string, tiers []map[string]any, limits map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(spec(t, cluster, nil), &m); err != nil {
		t.Fatal(err)
	}
	m["cluster"].(map[string]any)["capacity"] = tiers
	if limits != nil {
		m["limits"] = limits
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testCapacity kills the monitor inside the capacity paths: in a tier move,
// between the RayCluster update and the record's write; and at each write
// of the preemption path of a Spot node reclaimed while the save on notice
// still ran (the trainer's mark says failed, KubeRay has deleted the pod).
// Each run still ends once, a preempted attempt counts against
// limits.preemptions (limits.retries is 0), and the retry resumes from the
// newest complete checkpoint.
func testCapacity(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	wg.Go(func() { tierMoveCrash(t) })
	wg.Go(func() { preemptionLane(t) })
	wg.Wait()
}

func tierMoveCrash(t *testing.T) {
	const scenario, cluster = "crash in a tier move", "tier-move"
	data := tieredSpec(t, cluster, []map[string]any{{"type": "reservation", "wait": "1m"}, {"type": "spot"}}, nil)
	// The monitor's first write to the RayCluster is the tier move (the
	// provision function created it): it is killed once the API server
	// has taken the update, before the record says the attempt moved.
	crashed, disarm := st.CrashAt("Monitor", 1, func(r faults.Request) bool {
		return r.Method == "PUT" && strings.Contains(r.Path, "/rayclusters/"+cluster)
	}, 300*time.Millisecond)
	defer disarm()
	runID := upload(t, cluster, data, "refuse=reservation,steps=2,step=200ms")
	checkRun(t, scenario, runID, cluster, outcome{phase: runs.Succeeded, limit: 4 * time.Minute})
	select {
	case c := <-crashed:
		report.Note(scenario, "killed after "+c.After)
	default:
		t.Errorf("%s: the monitor never updated RayCluster %s", scenario, cluster)
		report.Add(scenario, 0, 0, "the crash point was never reached")
		return
	}
	rec, err := probe.Runs(st).Get(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if a := rec.CurrentAttempt(); a == nil || a.Tier != 1 || rec.Attempt != 1 {
		t.Errorf("%s: attempt %d on tier %v, want attempt 1 moved to tier 2 once", scenario, rec.Attempt, a)
	}
}

func preemptionLane(t *testing.T) {
	const scenario = "crash in the preemption path"
	report.Note(scenario, "a Spot node reclaimed during the save on notice at step 3: failed mark with noticeSeen, the pod deleted by KubeRay before the mark; limits.retries 0, limits.preemptions 1")
	for k := 1; k <= 8; k++ {
		cluster := fmt.Sprintf("reclaim-%d", k)
		data := tieredSpec(t, cluster, []map[string]any{{"type": "spot"}}, map[string]any{"retries": 0, "preemptions": 1})
		runID := upload(t, cluster, data, "preempt=3,preemptAs=reclaim-in-save,steps=2,step=300ms")
		// The monitor's writes for the run: its progress, then, once the
		// node is gone, the preemption evidence, the retry's ConfigMap and
		// RayCluster, and the record.
		mine := func(r faults.Request) bool {
			return strings.Contains(r.Path, runID) || strings.Contains(r.Path, cluster) ||
				r.Method == "POST" && strings.HasPrefix(r.Path, "/api") && strings.Contains(r.Path, "configmaps")
		}
		c, disarm := st.CrashAt("Monitor", k, mine, 300*time.Millisecond)
		checkRun(t, scenario, runID, cluster, outcome{phase: runs.Succeeded, attempts: 2})
		disarm()
		rec, err := probe.Runs(st).Get(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if retried, preempted := rec.Lost(); retried != 0 || preempted != 1 || rec.Attempt != 2 {
			t.Errorf("%s: run %s used %d retries and %d preemptions in %d attempts, want 0, 1 and 2", scenario, runID, retried, preempted, rec.Attempt)
			report.Add(scenario, 0, 0, fmt.Sprintf("run %s: %d retries, %d preemptions", runID, retried, preempted))
		}
		if a := rec.CurrentAttempt(); a == nil || !strings.Contains(a.ResumeFrom, "attempt-1/") || !strings.HasSuffix(strings.TrimSuffix(a.ResumeFrom, "/"), "checkpoint") {
			t.Errorf("%s: run %s attempt 2 resumes from %q, want attempt 1's newest complete checkpoint", scenario, runID, a.ResumeFrom)
		}
		select {
		case kill := <-c:
			report.Note(scenario, fmt.Sprintf("killed after monitor write %d: %s", k, kill.After))
		default:
			report.Note(scenario, fmt.Sprintf("run %s made fewer than %d monitor writes: every write point covered", runID, k))
			return
		}
	}
	report.Note(scenario, "the first 8 monitor writes of the run covered")
}
