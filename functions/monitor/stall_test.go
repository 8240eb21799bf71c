package monitor

import (
	"testing"
	"time"

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
	published := func(r *runs.Record) { r.Published = append(r.Published, runs.Stalled) }
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
		{"suspected and announced", rec(runs.Running, suspected, published), pulse(first, first, time.Second), first.Add(time.Hour), false, false},
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
