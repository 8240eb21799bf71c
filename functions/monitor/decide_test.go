package monitor

import (
	"errors"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
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
	announced = func(r *runs.Record) { r.Published = []runs.Phase{r.Phase} }
	attempt2  = func(r *runs.Record) {
		r.Attempt = 2
		r.Attempts = append(r.Attempts, runs.Attempt{N: 2, CreatedAt: t0})
	}
	running = job(rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	stale   = t0.Add(pipeline.StaleStep + time.Second)
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
		{"provisioned, fresh", Observation{Run: rec(runs.Provisioned), Sweep: true, Now: soon}, Wait, "", "", false},
		{"provisioned, stale, message", Observation{Run: rec(runs.Provisioned), Now: stale}, Wait, "", "", false},
		{"provisioned, stale, sweep", Observation{Run: rec(runs.Provisioned), Sweep: true, Now: stale}, Resend, "", pipeline.TopicProvisioned, false},
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
		{"finishing, fresh", Observation{Run: rec(runs.Finishing), Sweep: true, Now: soon}, Wait, "", "", false},
		{"finishing, stale, sweep", Observation{Run: rec(runs.Finishing), Sweep: true, Now: stale}, Resend, "", pipeline.TopicFinished, false},
	}
	for _, p := range []runs.Phase{runs.Succeeded, runs.Failed, runs.Cancelled, runs.Rejected} {
		cases = append(cases,
			decideCase{string(p) + ", unannounced, stale", Observation{Run: rec(p), Sweep: true, Now: stale}, Resend, "", pipeline.TopicFinished, false},
			decideCase{string(p) + ", announced", Observation{Run: rec(p, announced), Sweep: true, Now: stale}, Wait, "", "", false},
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
