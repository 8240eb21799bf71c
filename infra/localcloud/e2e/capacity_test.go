package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// tieredSpec is the example spec on cluster with the capacity tiers given.
func tieredSpec(t *testing.T, cluster string, tiers ...map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(specFor(t, cluster, nil), &m); err != nil {
		t.Fatal(err)
	}
	m["cluster"].(map[string]any)["capacity"] = tiers
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCapacityFallsBack: the reservation has no nodes, so after its wait
// the pipeline moves the pending workers to Spot VMs, where the run
// succeeds; the events name the tier that served it and the wait, and
// split the workers' start-up, read from their pods, into the wait for
// nodes and the image pull the simulated kubelet plays (pull=3s), then the
// time to the trainer's first report.
func TestCapacityFallsBack(t *testing.T) {
	t.Parallel()
	data := tieredSpec(t, "e2e-fallback",
		map[string]any{"type": "reservation", "wait": "1m"},
		map[string]any{"type": "spot", "gpuHourUsd": 3})
	runID := upload(t, "fallback", data, "refuse=reservation,pull=3s,env=1s,weights=2s,data=1s,steps=2,step=200ms")

	// While the reservation refuses, the run waits in SUBMITTED and its
	// record says why.
	deadline := time.Now().Add(45 * time.Second)
	var waiting string
	for time.Now().Before(deadline) && waiting == "" {
		if r, err := probe.Runs(st).Get(context.Background(), runID); err == nil && r.CurrentAttempt() != nil {
			waiting = r.CurrentAttempt().Waiting
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(waiting, "waiting for capacity on tier 1 (reservation b200-reservation): 0 of 2 workers running") || !strings.Contains(waiting, "didn't match Pod's node affinity/selector") {
		t.Errorf("record says %q while the reservation refuses", waiting)
	}

	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Attempt != 1 {
		t.Fatalf("phase %s attempt %d (%s); want SUCCEEDED on attempt 1", r.Phase, r.Attempt, r.Message)
	}
	a := r.CurrentAttempt()
	if a.Tier != 1 || a.TierSince == nil || a.TierSince.Sub(a.CreatedAt) < time.Minute || a.RunningAt == nil {
		t.Errorf("attempt %+v; want it moved to tier 2 a minute or more after it started, then running", a)
	}
	evs := eventsOf(t, runID)
	for _, phase := range []string{"running", "succeeded"} {
		i := slices.IndexFunc(evs, func(e probe.Seen) bool { return e.Phase == phase })
		if i < 0 {
			t.Fatalf("no %s event: %+v", phase, evs)
		}
		c := evs[i].Capacity
		if c == nil || c.Tier != "spot" || c.Index != 2 || !c.Served || c.WaitSeconds < 60 || c.Preemptions != 0 {
			t.Errorf("%s event's capacity %+v; want spot (tier 2), served after 60 s or more", phase, c)
		}
		// The API server keeps pod times to the second: a second's slack.
		u := evs[i].Startup
		if u == nil || u.NodesSeconds < 59 || u.ImageSeconds < 2 {
			t.Errorf("%s event's start-up %+v; want nodes after the reservation's minute (59 s or more), then an image pull of 2 s or more", phase, u)
			continue
		}
		t.Logf("%s event's start-up: nodes %.0f s, image %.0f s, to the first step %v s (runtime env %v s, weights %v s, data %v s, first step %v s), in all %.0f s",
			phase, u.NodesSeconds, u.ImageSeconds, fmtSeconds(u.FirstStepSeconds), fmtSeconds(u.RuntimeEnvSeconds), fmtSeconds(u.WeightsSeconds), fmtSeconds(u.DataSeconds), fmtSeconds(u.StepSeconds), u.Seconds)
		// Once the trainer reported, its own account splits the time to its
		// first step: the scenario's 1 s of runtime env (after the Ray job's
		// pending time), 2 s for the weights, 1 s for the data, a 200 ms step.
		// The account gives the weights' and the data's seconds to the
		// millisecond (rounded, as the trainer's), and the first step is what
		// is left: 2 ms below its 200 ms when both were rounded up and the
		// report followed the step at once.
		if u.FirstStepSeconds != nil {
			if u.RuntimeEnvSeconds == nil || *u.RuntimeEnvSeconds < 1 || *u.WeightsSeconds < 2 || *u.WeightsSeconds > 3 || *u.DataSeconds < 1 || *u.DataSeconds > 2 || *u.StepSeconds < 0.198 {
				t.Errorf("%s event's start-up: runtime env %v s, weights %v s, data %v s, first step %v s; want the trainer's runtime env of 1 s or more, weights 2–3 s, data 1–2 s, a first step of 0.2 s or more (less 2 ms of rounding)",
					phase, ms(u.RuntimeEnvSeconds), ms(u.WeightsSeconds), ms(u.DataSeconds), ms(u.StepSeconds))
			} else if sum := *u.RuntimeEnvSeconds + *u.WeightsSeconds + *u.DataSeconds + *u.StepSeconds; math.Abs(sum-*u.FirstStepSeconds) > 1e-6 {
				t.Errorf("%s event's trainer parts sum to %v, firstStepSeconds %v", phase, sum, *u.FirstStepSeconds)
			}
		}
		// The succeeded event also has the time to the trainer's first
		// report, which the running event (sent when the workers ran,
		// before the trainer reported) may not have.
		sum := u.NodesSeconds + u.ImageSeconds
		if u.FirstStepSeconds != nil {
			sum += *u.FirstStepSeconds
		}
		if u.Seconds != sum || phase == "succeeded" && (u.FirstStepSeconds == nil || evs[i].Timings["startup"] != u.Seconds) {
			t.Errorf("%s event's start-up %+v, timings.startup %v; want the parts' sum, and in the succeeded event the time to the first report and timings.startup", phase, u, evs[i].Timings["startup"])
		}
	}
	// The worker pods run on Spot VMs: the node selector GKE matches.
	pods, err := kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: names.LabelRayCluster + "=e2e-fallback"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Labels[names.LabelRayNodeType] == "worker" && p.Spec.NodeSelector[names.NodeSpot] != "true" {
			t.Errorf("worker %s selects %v, want Spot nodes", p.Name, p.Spec.NodeSelector)
		}
	}
	waitNoWorkers(t, "e2e-fallback")
}

// TestPreemptedTwice: a Spot run that loses a node twice succeeds, each
// attempt resuming from the checkpoint the trainer saved on the notice,
// with limits.retries untouched and two preemptions recorded.
func TestPreemptedTwice(t *testing.T) {
	t.Parallel()
	data := tieredSpec(t, "e2e-preempt", map[string]any{"type": "spot"})
	runID := upload(t, "preempt", data, "preempt=3/7,steps=4,step=200ms")
	r := waitPhase(t, runID, 180*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Attempt != 3 {
		t.Fatalf("phase %s attempt %d (%s); want SUCCEEDED on attempt 3", r.Phase, r.Attempt, r.Message)
	}
	if retried, preempted := r.Lost(); retried != 0 || preempted != 2 {
		t.Errorf("%d retries and %d preemptions used, want 0 and 2", retried, preempted)
	}
	for i, a := range r.Attempts[:2] {
		if a.Reason != runs.Preempted || len(a.Preemptions) == 0 {
			t.Errorf("attempt %d ended %s with evidence %v, want Preempted", a.N, a.Reason, a.Preemptions)
		}
		if next := r.Attempts[i+1]; !strings.Contains(next.ResumeFrom, "attempt-"+string(rune('1'+i))+"/") {
			t.Errorf("attempt %d resumes from %q, want attempt %d's checkpoint", next.N, next.ResumeFrom, a.N)
		}
	}
	// Each attempt resumed from the step the last one was preempted at:
	// the checkpoint saved on the notice, so no step was lost.
	var resumed []int
	for _, p := range st.Sim.Played() {
		if strings.HasPrefix(p.RayJob, "default/"+names.RayJob(runID, 1)[:len(names.RayJob(runID, 1))-1]) {
			resumed = append(resumed, p.ResumedFrom)
			if p.Scenario.Outcome == kubesim.Preempt && p.LastStep != p.Scenario.At {
				t.Errorf("%s preempted at step %d reported up to step %d, want the step it was on saved", p.RayJob, p.Scenario.At, p.LastStep)
			}
		}
	}
	if !slices.Equal(resumed, []int{0, 3, 7}) {
		t.Errorf("attempts resumed from steps %v, want [0 3 7]", resumed)
	}
	evs := eventsOf(t, runID)
	final := terminalOf(t, evs)
	if c := final.Capacity; c == nil || c.Preemptions != 2 || c.Tier != "spot" || final.Attempt != 3 {
		t.Errorf("succeeded event attempt %d capacity %+v; want attempt 3 on spot with 2 preemptions", final.Attempt, c)
	}
	waitNoWorkers(t, "e2e-preempt")
}

// TestReclaimedBeforeTheSaveEnded: a Spot node reclaimed while its worker
// is mid-step (it never sees the notice) or while the save on notice still
// runs. Either way the trainer's mark says failed, and KubeRay has deleted
// the failed pod before the mark is written, so the pod's own evidence is
// gone when the monitor looks. The attempt is still a preemption (from
// KubeRay's DeletedWorkerPod Event, and the mark's noticeSeen), retried
// against limits.preemptions with limits.retries 0, and resumes from the
// newest complete checkpoint (never the one the save left partial).
func TestReclaimedBeforeTheSaveEnded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		how      kubesim.Outcome
		evidence string
	}{
		{kubesim.Reclaim, "deleted by KubeRay in phase Failed"},
		{kubesim.ReclaimInSave, "a preemption notice came before it failed"},
	} {
		t.Run(string(c.how), func(t *testing.T) {
			t.Parallel()
			cluster := "e2e-" + string(c.how)
			var m map[string]any
			if err := json.Unmarshal(tieredSpec(t, cluster, map[string]any{"type": "spot"}), &m); err != nil {
				t.Fatal(err)
			}
			m["limits"] = map[string]any{"retries": 0, "preemptions": 2}
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			runID := upload(t, string(c.how), data, "preempt=3/6,preemptAs="+string(c.how)+",steps=2,step=200ms")
			r := waitPhase(t, runID, 180*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
			if r.Phase != runs.Succeeded || r.Attempt != 3 {
				t.Fatalf("phase %s attempt %d (%s %s); want SUCCEEDED on attempt 3", r.Phase, r.Attempt, r.Reason, r.Message)
			}
			if retried, preempted := r.Lost(); retried != 0 || preempted != 2 {
				t.Errorf("%d retries and %d preemptions used, want 0 and 2", retried, preempted)
			}
			for _, a := range r.Attempts[:2] {
				found := slices.ContainsFunc(a.Preemptions, func(s string) bool { return strings.Contains(s, c.evidence) })
				if a.Reason != runs.Preempted || !found {
					t.Errorf("attempt %d ended %s with evidence %q, want Preempted with %q", a.N, a.Reason, a.Preemptions, c.evidence)
				}
			}
			// The node went before the save of step 3 (6) ended, or before
			// the step did: each attempt resumes from the newest complete
			// checkpoint, the one the epoch before saved.
			var resumed []int
			prefix := "default/" + strings.TrimSuffix(names.RayJob(runID, 1), "1")
			for _, p := range st.Sim.Played() {
				if strings.HasPrefix(p.RayJob, prefix) {
					resumed = append(resumed, p.ResumedFrom)
				}
			}
			if !slices.Equal(resumed, []int{0, 2, 4}) {
				t.Errorf("attempts resumed from steps %v, want [0 2 4]", resumed)
			}
			waitNoWorkers(t, cluster)
		})
	}
}

// fmtSeconds is a number of seconds that may be missing.
// ms is seconds to the millisecond, "(none)" for none.
func ms(s *float64) string {
	if s == nil {
		return "(none)"
	}
	return fmt.Sprintf("%.3f", *s)
}

func fmtSeconds(s *float64) string {
	if s == nil {
		return "(not yet)"
	}
	return fmt.Sprintf("%.0f", *s)
}
