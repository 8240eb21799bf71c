package monitor

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/wiring"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// rec is a run in phase p, last written at t0, with the default limits
// (deadline 24h, start deadline 30m, one retry); attempt 1 started at t0
// from PROVISIONED on, running from SUBMITTED's successor on.
func rec(p runs.Phase, edit ...func(*runs.Record)) *runs.Record {
	s := spec.Defaults()
	r := &runs.Record{RunID: "r", Phase: p, Spec: &s, UpdatedAt: t0}
	switch p {
	case runs.Accepted, runs.Queued, runs.Rejected:
	case runs.Checking:
		r.Check = &runs.DataCheck{RayJob: "r-0", CreatedAt: t0}
	default:
		running := t0
		r.Attempt = 1
		r.Attempts = []runs.Attempt{{N: 1, CreatedAt: t0}}
		if p != runs.Provisioned && p != runs.Submitted {
			r.Attempts[0].RunningAt = &running
		}
	}
	for _, e := range edit {
		e(r)
	}
	return r
}

func job(dep rayv1.JobDeploymentStatus, js rayv1.JobStatus) *rayv1.RayJob {
	j := &rayv1.RayJob{}
	j.Status.JobDeploymentStatus, j.Status.JobStatus = dep, js
	return j
}

var (
	cancelled = func(r *runs.Record) { r.CancelRequested = true }
	announced = func(r *runs.Record) { r.Published = []runs.Phase{r.Phase, runs.ReportReady} }
	// terminalOut: the terminal event went out, the report's has not.
	terminalOut = func(r *runs.Record) { r.Published = []runs.Phase{r.Phase} }
	attempt2    = func(r *runs.Record) {
		r.Attempt = 2
		r.Attempts[0].Outcome, r.Attempts[0].Reason = runs.OutcomeRetried, runs.InfrastructureFailure
		r.Attempts = append(r.Attempts, runs.Attempt{N: 2, CreatedAt: t0})
	}
	running = job(rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	stale   = t0.Add(runs.StaleStep + time.Second)
	soon    = t0.Add(time.Second)
)

type decideCase struct {
	name   string
	o      Observation
	action Action
	reason runs.Reason // for Finish
	topic  string      // for Resend
	delete bool
}

// TestDecide covers every phase, and in the phases with a RayJob every
// case the monitor tells apart.
func TestDecide(t *testing.T) {
	cases := []decideCase{
		{"accepted, message", Observation{Run: rec(runs.Accepted), Now: stale}, Wait, "", "", false},
		{"accepted, sweep", Observation{Run: rec(runs.Accepted), Sweep: true, Now: soon}, Readmit, "", "", false},
		{"accepted, cancelled", Observation{Run: rec(runs.Accepted, cancelled), Now: soon}, Finish, runs.ReasonCancelled, "", false},
		{"queued, sweep", Observation{Run: rec(runs.Queued), Sweep: true, Now: soon}, Readmit, "", "", false},
		{"queued, cancelled", Observation{Run: rec(runs.Queued, cancelled), Sweep: true, Now: soon}, Finish, runs.ReasonCancelled, "", false},
		{"checking, job pending", Observation{Run: rec(runs.Checking), Job: job(rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning), Now: soon}, Wait, "", "", false},
		{"checking, job not listed yet", Observation{Run: rec(runs.Checking), Sweep: true, Now: soon}, Wait, "", "", false},
		{"checking, job lost", Observation{Run: rec(runs.Checking), Sweep: true, Now: t0.Add(lostJob + time.Second)}, Resend, "", wiring.TopicProvisioned, false},
		{"checking, passed", Observation{Run: rec(runs.Checking), Job: running, Check: &checkpoints.DataCheck{OK: true}, Now: soon}, Checked, "", "", false},
		{"checking, bad data", Observation{Run: rec(runs.Checking), Check: &checkpoints.DataCheck{Reason: "InvalidData", Message: "d/metadata.jsonl line 6 column 'image': image does not decode"}, Now: soon}, Finish, runs.InvalidData, "", false},
		{"checking, bad model", Observation{Run: rec(runs.Checking), Check: &checkpoints.DataCheck{Reason: "InvalidModel", Message: "not Gemma 3"}, Now: soon}, Finish, runs.InvalidModel, "", false},
		{"checking, job failed without a verdict", Observation{Run: rec(runs.Checking), Job: job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed), Now: soon}, Finish, runs.DataCheckFailed, "", false},
		{"checking, too long", Observation{Run: rec(runs.Checking), Job: running, Now: t0.Add(31 * time.Minute)}, Finish, runs.DataCheckFailed, "", true},
		{"checking, cancelled", Observation{Run: rec(runs.Checking, cancelled), Job: running, Now: soon}, Finish, runs.ReasonCancelled, "", true},
		{"provisioned, fresh", Observation{Run: rec(runs.Provisioned), Sweep: true, Now: soon}, Wait, "", "", false},
		{"provisioned, stale, message", Observation{Run: rec(runs.Provisioned), Now: stale}, Wait, "", "", false},
		{"provisioned, stale, sweep", Observation{Run: rec(runs.Provisioned), Sweep: true, Now: stale}, Resend, "", wiring.TopicProvisioned, false},
		{"provisioned, cancelled", Observation{Run: rec(runs.Provisioned, cancelled), Now: soon}, Finish, runs.ReasonCancelled, "", false},
		{"submitted, job pending", Observation{Run: rec(runs.Submitted), Job: job(rayv1.JobDeploymentStatusInitializing, rayv1.JobStatusNew), Now: soon}, Wait, "", "", false},
		{"submitted, job not listed yet", Observation{Run: rec(runs.Submitted), Sweep: true, Now: soon}, Wait, "", "", false},
		{"submitted, job lost", Observation{Run: rec(runs.Submitted), Sweep: true, Now: t0.Add(lostJob + time.Second)}, Retry, "", "", false},
		{"submitted, job running", Observation{Run: rec(runs.Submitted), Job: running, Now: soon}, Progress, "", "", false},
		{"submitted, start deadline", Observation{Run: rec(runs.Submitted), Job: job(rayv1.JobDeploymentStatusInitializing, ""), Now: t0.Add(31 * time.Minute)}, Finish, runs.StartDeadlineExceeded, "", true},
		{"submitted, cancelled", Observation{Run: rec(runs.Submitted, cancelled), Job: running, Now: soon}, Finish, runs.ReasonCancelled, "", true},
		{"running, progress", Observation{Run: rec(runs.Running), Job: running, Now: soon}, Progress, "", "", false},
		{"running, cancelled", Observation{Run: rec(runs.Running, cancelled), Job: running, Now: soon}, Finish, runs.ReasonCancelled, "", true},
		{"running, deadline", Observation{Run: rec(runs.Running), Job: running, Now: t0.Add(25 * time.Hour)}, Finish, runs.DeadlineExceeded, "", true},
		{"running, mark succeeded", Observation{Run: rec(runs.Running), Job: running, Mark: &checkpoints.Mark{Status: "succeeded"}, Now: soon}, Succeed, "", "", false},
		{"running, mark failed", Observation{Run: rec(runs.Running), Job: running, Mark: &checkpoints.Mark{Status: "failed", Error: "ValueError: x\ntrace"}, Now: soon}, Finish, runs.ApplicationError, "", false},
		{"running, job complete", Observation{Run: rec(runs.Running), Job: job(rayv1.JobDeploymentStatusComplete, rayv1.JobStatusSucceeded), Now: soon}, Succeed, "", "", false},
		{"running, job failed, retry left", Observation{Run: rec(runs.Running), Job: job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed), Now: soon}, Retry, "", "", false},
		{"running, job failed, no retry left", Observation{Run: rec(runs.Running, attempt2), Job: job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed), Now: soon}, Finish, runs.InfrastructureFailure, "", false},
		{"running, job lost, no retry left", Observation{Run: rec(runs.Running, attempt2), Sweep: true, Now: soon}, Finish, runs.InfrastructureFailure, "", false},
		{"running, job refused", Observation{Run: rec(runs.Running), Job: job(rayv1.JobDeploymentStatusValidationFailed, ""), Now: soon}, Finish, runs.InvalidJob, "", false},
		{"running trial, stopped early", Observation{Run: rec(runs.Running), Job: running, EarlyStop: "held-out loss 2.6 at checkpoint 1 is worse than the median 2", Now: soon}, Finish, runs.EarlyStopped, "", true},
		{"running trial, stopped early after its mark said succeeded", Observation{Run: rec(runs.Running), Job: running, Mark: &checkpoints.Mark{Status: "succeeded"}, EarlyStop: "worse", Now: soon}, Succeed, "", "", false},
		{"running trial, cancelled while it trails", Observation{Run: rec(runs.Running, cancelled), Job: running, EarlyStop: "worse", Now: soon}, Finish, runs.ReasonCancelled, "", true},
		{"finishing, fresh", Observation{Run: rec(runs.Finishing), Sweep: true, Now: soon}, Wait, "", "", false},
		{"finishing, stale, sweep", Observation{Run: rec(runs.Finishing), Sweep: true, Now: stale}, Resend, "", wiring.TopicFinished, false},
	}
	for _, p := range []runs.Phase{runs.Succeeded, runs.Failed, runs.Cancelled, runs.Rejected, runs.Stopped} {
		cases = append(cases,
			decideCase{string(p) + ", unannounced, stale", Observation{Run: rec(p), Sweep: true, Now: stale}, Resend, "", wiring.TopicFinished, false},
			decideCase{string(p) + ", announced", Observation{Run: rec(p, announced), Sweep: true, Now: stale}, Wait, "", "", false},
			decideCase{string(p) + ", its terminal event out, its report not, stale", Observation{Run: rec(p, terminalOut), Sweep: true, Now: stale}, Resend, "", wiring.TopicFinished, false},
		)
	}
	covered := map[runs.Phase]bool{}
	for _, c := range cases {
		covered[c.o.Run.Phase] = true
		d, err := Decide(c.o)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if d.Action != c.action || d.Ending.Reason != c.reason || d.Topic != c.topic || d.DeleteJob != c.delete {
			t.Errorf("%s: %+v, want %s (reason %q, topic %q, delete %v)", c.name, d, c.action, c.reason, c.topic, c.delete)
		}
		if d.Action == Finish {
			if err := d.Ending.Check(); err != nil || d.Ending.Message == "" {
				t.Errorf("%s: ending %+v: %v", c.name, d.Ending, err)
			}
		}
	}
	for _, p := range runs.Phases() {
		if !covered[p] {
			t.Errorf("phase %s has no case in TestDecide", p)
		}
	}
}

// TestDecideKnowsEveryPhase: every phase of the lifecycle gets a decision;
// a phase added to the lifecycle that the monitor was not taught fails here
// (and is a logged error in production, never a silent skip).
func TestDecideKnowsEveryPhase(t *testing.T) {
	for _, p := range runs.Phases() {
		for _, sweep := range []bool{false, true} {
			o := Observation{Run: rec(p), Sweep: sweep, Job: running, Now: stale}
			if _, err := Decide(o); err != nil {
				t.Errorf("phase %s (sweep %v): %v", p, sweep, err)
			}
		}
	}
	_, err := Decide(Observation{Run: rec("PAUSED"), Now: soon})
	if !errors.Is(err, errUnknownPhase) {
		t.Errorf("unknown phase: %v, want errUnknownPhase", err)
	}
}

func TestDecideMessages(t *testing.T) {
	d, _ := Decide(Observation{Run: rec(runs.Running, attempt2), Job: job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed), Now: soon})
	if !strings.Contains(d.Ending.Message, "no retries left after 2 attempts") {
		t.Errorf("message %q", d.Ending.Message)
	}
	d, _ = Decide(Observation{Run: rec(runs.Running), Job: running, Mark: &checkpoints.Mark{Status: "failed", Error: "ValueError: x\ntrace"}, Now: soon})
	if d.Ending.Message != "training failed: ValueError: x" {
		t.Errorf("message %q", d.Ending.Message)
	}
}

// tiered is a run on three capacity tiers (reservation for 10m, flex-start
// for 5m, then spot), its attempt on tier tier since t0.
func tiered(p runs.Phase, tier int) *runs.Record {
	return rec(p, func(r *runs.Record) {
		r.Spec.Cluster.Reservation = "b200"
		r.Spec.Cluster.Capacity = []spec.Tier{
			{Type: spec.TierReservation, Wait: spec.Duration(10 * time.Minute)},
			{Type: spec.TierFlexStart, Wait: spec.Duration(5 * time.Minute)},
			{Type: spec.TierSpot},
		}
		r.Attempts[0].Tier = tier
	})
}

// TestDecideCapacity: workers that do not all run keep an attempt from
// running; each tier gets its wait, the last waits for the start deadline.
func TestDecideCapacity(t *testing.T) {
	pending := &Workers{Need: 2, Running: 1, Pending: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}
	all := &Workers{Need: 2, Running: 2}
	cases := []struct {
		name   string
		o      Observation
		action Action
		reason runs.Reason
		why    string
	}{
		{"tier 1, within its wait", Observation{Run: tiered(runs.Submitted, 0), Job: running, Workers: pending, Now: t0.Add(9 * time.Minute)}, Wait, "", "waiting for capacity on tier 1 (reservation b200): 1 of 2 workers running; 0/3 nodes are available"},
		{"tier 1, wait over", Observation{Run: tiered(runs.Submitted, 0), Job: running, Workers: pending, Now: t0.Add(10 * time.Minute)}, NextTier, "", "reservation b200 gave 1 of 2 workers in 10m0s"},
		{"tier 2, wait over", Observation{Run: tiered(runs.Submitted, 1), Job: running, Workers: pending, Now: t0.Add(5 * time.Minute)}, NextTier, "", "flexStart gave 1 of 2"},
		{"last tier waits", Observation{Run: tiered(runs.Submitted, 2), Job: running, Workers: pending, Now: t0.Add(29 * time.Minute)}, Wait, "", "tier 3 (spot)"},
		{"last tier, start deadline", Observation{Run: tiered(runs.Submitted, 2), Job: running, Workers: pending, Now: t0.Add(31 * time.Minute)}, Finish, runs.StartDeadlineExceeded, ""},
		{"all workers run", Observation{Run: tiered(runs.Submitted, 1), Job: running, Workers: all, Now: soon}, Progress, "", ""},
		{"job pending, workers too", Observation{Run: tiered(runs.Submitted, 0), Job: job(rayv1.JobDeploymentStatusInitializing, ""), Workers: pending, Now: soon}, Wait, "", "tier 1"},
		{"running attempt keeps running", Observation{Run: tiered(runs.Running, 0), Job: running, Workers: pending, Now: t0.Add(time.Hour)}, Progress, "", ""},
	}
	for _, c := range cases {
		d, err := Decide(c.o)
		if err != nil || d.Action != c.action || d.Ending.Reason != c.reason || !strings.Contains(d.Why, c.why) {
			t.Errorf("%s: %+v %v, want %s %q why ~%q", c.name, d, err, c.action, c.reason, c.why)
		}
	}
	// The tier the running workers' nodes are on is the one that served
	// the attempt, whatever tier it waited on last.
	// So is how they came up.
	up := &runs.Startup{ScheduledAt: t0.Add(time.Minute), StartedAt: t0.Add(2 * time.Minute)}
	d, _ := Decide(Observation{Run: tiered(runs.Submitted, 0), Job: running, Workers: &Workers{Need: 2, Running: 2, ServedOn: 2, Startup: up}, Now: soon})
	if d.Action != Progress || d.ServedOn != 2 || d.Startup != up {
		t.Errorf("workers running on tier 3: %+v, want progress served on tier index 2 with their start-up", d)
	}
	d, _ = Decide(Observation{Run: tiered(runs.Running, 0), Job: running, Workers: &Workers{Need: 2, Running: 2, ServedOn: 2, Startup: up}, Now: soon})
	if d.ServedOn != -1 || d.Startup != nil {
		t.Errorf("a running attempt's tier or start-up changed: %+v", d)
	}
	// A job so short that no check saw it running: its success says which
	// tier served it (the record may still name the tier it moved from,
	// when the move's record write was lost).
	succeeded := job(rayv1.JobDeploymentStatusComplete, rayv1.JobStatusSucceeded)
	d, _ = Decide(Observation{Run: tiered(runs.Submitted, 0), Job: succeeded, Workers: &Workers{Need: 2, Running: 2, ServedOn: 1}, Now: soon})
	if d.Action != Succeed || d.ServedOn != 1 {
		t.Errorf("a short job's workers ran on tier 2: %+v, want succeed served on tier index 1", d)
	}
	d, _ = Decide(Observation{Run: tiered(runs.Submitted, 0), Mark: &checkpoints.Mark{Status: "succeeded"}, Workers: &Workers{Need: 2, Running: 2, ServedOn: 1}, Now: soon})
	if d.Action != Succeed || d.ServedOn != 1 {
		t.Errorf("a short job's mark, workers on tier 2: %+v, want succeed served on tier index 1", d)
	}
}

// TestDecidePreemption: an attempt lost with evidence of preemption is
// retried against limits.preemptions, never limits.retries, and the
// evidence not yet recorded comes with the decision.
func TestDecidePreemption(t *testing.T) {
	failed := job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	disrupted := &Workers{Need: 2, Running: 1, Disrupted: []string{"w-1: TerminationByKubelet"}}
	lostTwice := func(r *runs.Record) {
		// Two attempts lost to preemption and one to a lost head: every
		// retry and two preemptions used.
		r.Attempts = nil
		for n, reason := range []runs.Reason{runs.Preempted, runs.InfrastructureFailure, runs.Preempted} {
			r.Attempts = append(r.Attempts, runs.Attempt{N: n + 1, CreatedAt: t0, Outcome: runs.OutcomeRetried, Reason: reason})
		}
		r.Attempt = 4
		r.Attempts = append(r.Attempts, runs.Attempt{N: 4, CreatedAt: t0, RunningAt: &t0})
	}
	budget := func(n int) func(*runs.Record) { return func(r *runs.Record) { r.Spec.Limits.Preemptions = n } }
	cases := []struct {
		name     string
		o        Observation
		action   Action
		reason   runs.Reason
		evidence int
	}{
		{"pod disrupted, job still running", Observation{Run: rec(runs.Running), Job: running, Workers: disrupted, Now: soon}, Progress, "", 1},
		{"job failed, disruption seen now", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Workers: disrupted, Now: soon}, Retry, "", 1},
		{"job failed, disruption recorded before", Observation{Run: rec(runs.Running, lostTwice, func(r *runs.Record) { r.Attempts[3].Preemptions = []string{"w-1: TerminationByKubelet"} }), Job: failed, Workers: disrupted, Now: soon}, Retry, "", 0},
		{"trainer checkpointed on notice", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Mark: &checkpoints.Mark{Status: checkpoints.MarkPreempted}, Now: soon}, Retry, "", 1},
		{"job failed, no evidence, no retry left", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Now: soon}, Finish, runs.InfrastructureFailure, 0},
		// A node reclaimed before the save on notice ended: the driver
		// writes a failed mark, which is still a preemption.
		{"failed mark after a notice", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Mark: &checkpoints.Mark{Status: "failed", Error: "ActorDiedError: the worker died", NoticeSeen: true}, Now: soon}, Retry, "", 1},
		{"failed mark, pod lost (KubeRay's event)", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Mark: &checkpoints.Mark{Status: "failed", Error: "ActorDiedError: the worker died"}, Workers: &Workers{Need: 2, Running: 1, Disrupted: []string{"w-1: deleted by KubeRay in phase Failed"}}, Now: soon}, Retry, "", 1},
		{"failed mark, disruption recorded before", Observation{Run: rec(runs.Running, lostTwice, func(r *runs.Record) { r.Attempts[3].Preemptions = []string{"w-1: TerminationByKubelet"} }), Job: failed, Mark: &checkpoints.Mark{Status: "failed", Error: "ActorDiedError"}, Now: soon}, Retry, "", 0},
		{"failed mark after a notice, budget spent", Observation{Run: rec(runs.Running, lostTwice, budget(2)), Job: failed, Mark: &checkpoints.Mark{Status: "failed", NoticeSeen: true}, Now: soon}, Finish, runs.Preempted, 1},
		{"failed mark, no evidence", Observation{Run: rec(runs.Running, lostTwice), Job: failed, Mark: &checkpoints.Mark{Status: "failed", Error: "ValueError: bad"}, Workers: &Workers{Need: 2, Running: 2}, Now: soon}, Finish, runs.ApplicationError, 0},
		{"preemption budget spent", Observation{Run: rec(runs.Running, lostTwice, budget(2)), Job: failed, Workers: disrupted, Now: soon}, Finish, runs.Preempted, 1},
	}
	for _, c := range cases {
		d, err := Decide(c.o)
		if err != nil || d.Action != c.action || d.Ending.Reason != c.reason || len(d.Preempted) != c.evidence {
			t.Errorf("%s: %+v %v, want %s %q with %d new evidence", c.name, d, err, c.action, c.reason, c.evidence)
		}
	}
}

// TestDecideUnreadableMark: a mark the pipeline can never read ends the run
// (its GPUs freed) unless it is cancelled or past a deadline first.
func TestDecideUnreadableMark(t *testing.T) {
	o := Observation{Run: rec(runs.Running), Job: running, Unreadable: "googleapi: Error 403", Now: soon}
	d, err := Decide(o)
	if err != nil || d.Action != Finish || d.Ending.Reason != runs.CheckpointsUnreadable || !d.DeleteJob || !strings.Contains(d.Ending.Message, "403") {
		t.Errorf("%+v %v; want finish CheckpointsUnreadable, deleting the job", d, err)
	}
	o.Run = rec(runs.Running, cancelled)
	if d, _ := Decide(o); d.Ending.Reason != runs.ReasonCancelled {
		t.Errorf("a cancelled run with an unreadable mark: %+v, want cancelled", d)
	}
}

// TestRetryPolicy: a failed mark is retried only where its cause says a
// retry can help, within limits.retries, and never into the same failure.
func TestRetryPolicy(t *testing.T) {
	failedMark := &checkpoints.Mark{Status: "failed", Error: "WorkerGroupError: Training failed due to worker errors"}
	ended := job(rayv1.JobDeploymentStatusComplete, rayv1.JobStatusFailed)
	c := func(kind cause.Kind, step int64) *runs.Cause {
		return &runs.Cause{Kind: string(kind), Summary: string(kind) + " on rank 3", Rank: 3, Step: step}
	}
	// after: attempt 1 was retried with cause prev; attempt 2 is current.
	after := func(prev *runs.Cause) func(*runs.Record) {
		return func(r *runs.Record) {
			attempt2(r)
			r.Attempts[0].Cause = prev
			r.Spec.Limits.Retries = 3
		}
	}
	for _, tc := range []struct {
		name   string
		run    *runs.Record
		cause  *runs.Cause
		action Action
		reason runs.Reason
	}{
		{"a python exception is never retried", rec(runs.Running), c(cause.PythonException, 12), Finish, runs.ApplicationError},
		{"a data error is never retried", rec(runs.Running), c(cause.DataError, 0), Finish, runs.ApplicationError},
		{"an unknown failure of the training code is not retried", rec(runs.Running), c(cause.Unknown, 5), Finish, runs.ApplicationError},
		{"no cause named: as before, not retried", rec(runs.Running), nil, Finish, runs.ApplicationError},
		{"a CUDA OOM is retried once", rec(runs.Running), c(cause.CudaOutOfMemory, 12), Retry, ""},
		{"a CUDA OOM at the same step twice is not", rec(runs.Running, after(c(cause.CudaOutOfMemory, 12))), c(cause.CudaOutOfMemory, 12), Finish, runs.ApplicationError},
		{"a CUDA OOM at another step is", rec(runs.Running, after(c(cause.CudaOutOfMemory, 12))), c(cause.CudaOutOfMemory, 30), Retry, ""},
		{"an OOM kill at the same step twice is not", rec(runs.Running, after(c(cause.OOMKilled, 7))), c(cause.OOMKilled, 7), Finish, runs.ApplicationError},
		{"an NCCL timeout is retried", rec(runs.Running), c(cause.NcclTimeout, 40), Retry, ""},
		{"an NCCL timeout is retried once", rec(runs.Running, after(c(cause.NcclTimeout, 40))), c(cause.NcclTimeout, 80), Finish, runs.InfrastructureFailure},
		{"an NCCL timeout after a CUDA OOM is", rec(runs.Running, after(c(cause.CudaOutOfMemory, 10))), c(cause.NcclTimeout, 80), Retry, ""},
		{"a GPU error is retried", rec(runs.Running), c(cause.GpuError, 3), Retry, ""},
		{"a GPU error again, within limits.retries", rec(runs.Running, after(c(cause.GpuError, 3))), c(cause.GpuError, 3), Retry, ""},
		{"an NCCL error with no retry left", rec(runs.Running, func(r *runs.Record) { r.Spec.Limits.Retries = 0 }), c(cause.NcclError, 3), Finish, runs.InfrastructureFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(Observation{Run: tc.run, Job: ended, Mark: failedMark, Cause: tc.cause, Now: soon})
			if err != nil || d.Action != tc.action || d.Ending.Reason != tc.reason {
				t.Fatalf("%+v %v; want %s %q", d, err, tc.action, tc.reason)
			}
			if d.Action == Retry && (d.Cause != tc.cause || !strings.Contains(d.Why, tc.cause.Kind)) {
				t.Errorf("a retry carries cause %+v and why %q, want %s", d.Cause, d.Why, tc.cause.Kind)
			}
			if d.Action == Finish && !strings.HasPrefix(d.Ending.Message, "training failed: WorkerGroupError") {
				t.Errorf("message %q, want the mark's error", d.Ending.Message)
			}
		})
	}
}

// TestRetryPolicyNamesEveryCause: the table decides every cause a failed
// mark can have; the rest are never retried from it.
func TestRetryPolicyNamesEveryCause(t *testing.T) {
	for k := range RetryPolicy {
		if !slices.Contains(cause.Kinds, k) {
			t.Errorf("RetryPolicy names %s, not a cause", k)
		}
	}
	for _, k := range []cause.Kind{cause.Preempted, cause.Stalled, cause.DeadlineExceeded, cause.Cancelled, cause.ImagePull} {
		if RetryPolicy[k] != never {
			t.Errorf("%s: retried from a failed mark", k)
		}
	}
}
