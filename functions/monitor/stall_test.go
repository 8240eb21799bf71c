package monitor

import (
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// pulse is ranks that ended their first step at first and last moved at
// moved, with a median step of step.
func pulse(first, moved time.Time, step time.Duration) *checkpoints.Pulse {
	return &checkpoints.Pulse{Ranks: 2, Step: 3, FirstStep: first, Moved: moved, StepTime: step, Doing: "training"}
}

// TestDecideStall: the window is the longer of stallAfter and stallFactor
// median steps, counted from the last sign of progress, and only once the
// first step has ended; one suspicion is recorded and announced once.
func TestDecideStall(t *testing.T) {
	first := t0.Add(5 * time.Minute)
	lim := spec.Defaults().Limits // stallAfter 10m, stallFactor 5
	if time.Duration(lim.StallAfter) != 10*time.Minute || lim.StallFactor != 5 {
		t.Fatalf("defaults changed: %+v", lim)
	}
	suspected := func(r *runs.Record) {
		r.Attempts[0].Stall = &runs.Stall{SuspectedAt: first.Add(11 * time.Minute), Step: 3, Since: first, Window: 10 * time.Minute}
	}
	published := func(r *runs.Record) { r.Published = append(r.Published, runs.StallSuspected) }
	cleared := func(r *runs.Record) {
		at := first.Add(12 * time.Minute)
		r.Attempts[0].Stall.ClearedAt = &at
	}
	cases := []struct {
		name  string
		r     *runs.Record
		p     *checkpoints.Pulse
		now   time.Time
		stall bool
		moved bool // a Progress that clears the suspicion
	}{
		{"no heartbeat", rec(runs.Running), nil, first.Add(time.Hour), false, false},
		{"no first step yet: loading never counts", rec(runs.Running), pulse(time.Time{}, t0, 0), t0.Add(5 * time.Hour), false, false},
		{"within stallAfter", rec(runs.Running), pulse(first, first, time.Second), first.Add(10 * time.Minute), false, false},
		{"past stallAfter", rec(runs.Running), pulse(first, first, time.Second), first.Add(10*time.Minute + time.Second), true, false},
		{"slow steps widen the window", rec(runs.Running), pulse(first, first, 3*time.Minute), first.Add(14 * time.Minute), false, false},
		{"past five slow steps", rec(runs.Running), pulse(first, first, 3*time.Minute), first.Add(15*time.Minute + time.Second), true, false},
		{"every rank ended training", rec(runs.Running), &checkpoints.Pulse{Step: 3, FirstStep: first, Moved: first, Doing: "ended"}, first.Add(time.Hour), false, false},
		{"suspected, its event not out", rec(runs.Running, suspected), pulse(first, first, time.Second), first.Add(time.Hour), true, false},
		{"suspected, then a rank moved", rec(runs.Running, suspected, published), pulse(first, first.Add(12*time.Minute), time.Second), first.Add(13 * time.Minute), false, true},
		{"cleared, then still again", rec(runs.Running, suspected, published, cleared), pulse(first, first.Add(12*time.Minute), time.Second), first.Add(23 * time.Minute), true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(Observation{Run: c.r, Job: running, Pulse: c.p, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Action == Stall; got != c.stall {
				t.Fatalf("action %s, want stall %v", d.Action, c.stall)
			}
			if !c.stall {
				if d.Action != Progress || d.Moved.IsZero() != !c.moved {
					t.Fatalf("decision %+v, want a progress (clearing: %v)", d, c.moved)
				}
				return
			}
			s := d.Stall
			if s.Since != c.p.Moved || s.Step != 3 || !s.SuspectedAt.Equal(c.now) || s.Window < 10*time.Minute || c.now.Sub(s.Since) <= s.Window {
				t.Fatalf("stall %+v", s)
			}
		})
	}
}

// TestClearStall: a rank's move after the suspicion's last sign of
// progress clears it, once; an earlier one does not.
func TestClearStall(t *testing.T) {
	since := t0
	a := &runs.Attempt{Stall: &runs.Stall{Since: since}}
	if clearStall(a, since) || clearStall(a, time.Time{}) || clearStall(nil, t0.Add(time.Minute)) {
		t.Fatal("cleared without a move after the suspicion")
	}
	if !clearStall(a, since.Add(time.Minute)) || !a.Stall.ClearedAt.Equal(since.Add(time.Minute)) {
		t.Fatalf("not cleared: %+v", a.Stall)
	}
	if clearStall(a, since.Add(2*time.Minute)) {
		t.Fatal("cleared twice")
	}
}

// TestActOnStall: a suspected, announced stall is acted on once every
// rank's stacks are in, or the grace for them has passed, or the job is
// gone: a restart from the latest checkpoint while limits.stallRestarts
// allows, then the run fails Stalled; a job that ended on its own is
// judged by how it ended.
func TestActOnStall(t *testing.T) {
	first := t0.Add(5 * time.Minute)
	suspectedAt := first.Add(11 * time.Minute)
	suspected := func(r *runs.Record) {
		a := r.CurrentAttempt()
		a.Stall = &runs.Stall{SuspectedAt: suspectedAt, Step: 3, Since: first, Window: 10 * time.Minute}
		r.Published = append(r.Published, runs.StallSuspected)
	}
	restarted := func(r *runs.Record) {
		r.Attempts[0].Outcome, r.Attempts[0].Reason = runs.OutcomeRetried, runs.Stalled
		r.Attempts = append(r.Attempts, runs.Attempt{N: 2, CreatedAt: t0, RunningAt: r.Attempts[0].RunningAt})
		r.Attempt = 2
	}
	failed := job(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	cases := []struct {
		name   string
		r      *runs.Record
		job    *rayv1.RayJob
		stacks int
		now    time.Time
		action Action
		reason runs.Reason
	}{
		{"the stacks not in yet", rec(runs.Running, suspected), running, 1, suspectedAt.Add(time.Minute), Wait, ""},
		{"every rank's stacks in: restart", rec(runs.Running, suspected), running, 2, suspectedAt.Add(5 * time.Second), Retry, ""},
		{"the grace passed without them: restart", rec(runs.Running, suspected), running, 0, suspectedAt.Add(StacksGrace), Retry, ""},
		{"the job gone (deleted before a crash): restart", rec(runs.Running, suspected), nil, 0, suspectedAt.Add(time.Second), Retry, ""},
		{"restarts used up: fail Stalled", rec(runs.Running, restarted, suspected), running, 2, suspectedAt.Add(5 * time.Second), Finish, runs.Stalled},
		{"the job ended on its own: judged by its end", rec(runs.Running, suspected), failed, 2, suspectedAt.Add(5 * time.Second), Retry, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(Observation{Run: c.r, Job: c.job, Pulse: pulse(first, first, time.Second), Stacks: c.stacks, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != c.action || d.Ending.Reason != c.reason {
				t.Fatalf("decision %+v, want %s %s", d, c.action, c.reason)
			}
			switch {
			case c.job == failed:
				if d.Cause != nil || d.DeleteJob {
					t.Errorf("an ended job retried as a stall: %+v", d)
				}
			case d.Action == Retry:
				if !d.DeleteJob || d.Cause == nil || d.Cause.Kind != string(runs.Stalled) || !strings.Contains(d.Why, "restart 1 of limits.stallRestarts 1") {
					t.Errorf("restart %+v", d)
				}
			case d.Action == Finish:
				if !d.DeleteJob || !strings.Contains(d.Ending.Message, "1 restarts already (limits.stallRestarts 1)") {
					t.Errorf("failure %+v", d)
				}
			}
		})
	}
	// Restarts count apart from retries.
	r := rec(runs.Running, restarted)
	if retried, _ := r.Lost(); retried != 0 || r.StallRestarts() != 1 {
		t.Fatalf("lost %d, stall restarts %d", retried, r.StallRestarts())
	}
}
