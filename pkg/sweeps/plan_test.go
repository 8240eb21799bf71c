package sweeps

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// sweepOf is a record of a grid of n learning rates over clusters a and b,
// with edit applied to its sweep.
func sweepOf(t *testing.T, n int, edit func(*spec.Sweep)) *Record {
	t.Helper()
	s := spec.Defaults()
	s.Cluster.ServiceAccount, s.Cluster.Reservation, s.Output.Bucket = "sa", "r", "bucket-x"
	var values []float64
	for i := range n {
		values = append(values, 1e-4*float64(i+1))
	}
	s.Sweep.Parameters = []spec.SweepParameter{{Path: "training.learningRate", Values: values}}
	s.Sweep.Clusters = []string{"a", "b"}
	if edit != nil {
		edit(&s.Sweep)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := NewRecord("sw-1", "test", "sw", "hash", &s, t0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func loss(v float64) *float64 { return &v }

// started marks trials started on clusters, as an earlier advance did.
func started(r *Record, clusters ...string) *Record {
	for i, c := range clusters {
		r.Trials[i].Cluster, r.Trials[i].StartedAt = c, &t0
	}
	return r
}

func ended(r *Record, index int, p runs.Phase, best float64) *Record {
	t := &r.Trials[index-1]
	t.Ended, t.EndedAt = p, &t0
	if best > 0 {
		t.BestEvalLoss, t.BestCheckpoint = loss(best), "gs://b/"+t.RunID
	}
	return r
}

func TestAdvance(t *testing.T) {
	id := func(i int) string { return TrialRunID("sw-1", i) }
	exists := func(p runs.Phase) TrialState { return TrialState{Exists: true, Phase: p} }
	cases := []struct {
		name    string
		rec     *Record
		states  map[string]TrialState
		leaving string
		// want
		started  []int
		create   []int
		ended    bool
		phase    Phase
		best     int
		clusters []string // of the trials, in order ("" for not started)
	}{
		{
			name: "a new sweep starts one trial per cluster", rec: sweepOf(t, 4, nil),
			started: []int{1, 2}, create: []int{1, 2}, phase: Running, clusters: []string{"a", "b", "", ""},
		},
		{
			name: "parallel 1 over two clusters: one at a time", rec: sweepOf(t, 3, func(w *spec.Sweep) { w.Parallel = 1 }),
			started: []int{1}, create: []int{1}, phase: Running, clusters: []string{"a", "", ""},
		},
		{
			name: "a trial whose record a dead delivery never wrote is created again", rec: started(sweepOf(t, 4, nil), "a", "b"),
			states: map[string]TrialState{id(1): exists(runs.Running)},
			create: []int{2}, phase: Running, clusters: []string{"a", "b", "", ""},
		},
		{
			name: "a trial ended: the next starts on its cluster", rec: started(sweepOf(t, 4, nil), "a", "b"),
			states:  map[string]TrialState{id(1): {Exists: true, Phase: runs.Succeeded, BestEvalLoss: loss(1.2), BestCheckpoint: "gs://x"}, id(2): exists(runs.Running)},
			started: []int{3}, create: []int{3}, phase: Running, clusters: []string{"a", "b", "a", ""},
		},
		{
			name: "a trial leaving hands its cluster over before it has ended", rec: started(sweepOf(t, 4, nil), "a", "b"),
			states: map[string]TrialState{id(1): exists(runs.Running), id(2): exists(runs.Finishing)}, leaving: id(2),
			started: []int{3}, create: []int{3}, phase: Running, clusters: []string{"a", "b", "b", ""},
		},
		{
			name: "the last trials ended: the sweep succeeds, naming the best", rec: started(ended(sweepOf(t, 2, nil), 1, runs.Succeeded, 1.5), "a", "b"),
			states: map[string]TrialState{id(1): exists(runs.Succeeded), id(2): {Exists: true, Phase: runs.Stopped, BestEvalLoss: loss(1.1), BestCheckpoint: "gs://y"}},
			ended:  true, phase: Succeeded, best: 2, clusters: []string{"a", "b"},
		},
		{
			name: "no trial left a checkpoint: the sweep fails", rec: started(ended(sweepOf(t, 2, nil), 1, runs.Failed, 0), "a", "b"),
			states: map[string]TrialState{id(1): exists(runs.Failed), id(2): exists(runs.Failed)},
			ended:  true, phase: Failed, clusters: []string{"a", "b"},
		},
		{
			name: "the budget used: no new trial, the sweep ends once the running ones have",
			rec: func() *Record {
				r := started(sweepOf(t, 4, func(w *spec.Sweep) { w.Budget.GPUHours = 10 }), "a", "b")
				return r
			}(),
			states: map[string]TrialState{id(1): {Exists: true, Phase: runs.Succeeded, GPUHours: 6, BestEvalLoss: loss(1), BestCheckpoint: "gs://x"}, id(2): {Exists: true, Phase: runs.Running, GPUHours: 5}},
			phase:  Running, clusters: []string{"a", "b", "", ""},
		},
		{
			name: "cancelled: nothing starts; ends cancelled once the trials have",
			rec: func() *Record {
				r := started(sweepOf(t, 4, nil), "a", "b")
				r.CancelRequested = true
				return r
			}(),
			states: map[string]TrialState{id(1): exists(runs.Cancelled), id(2): exists(runs.Cancelled)},
			ended:  true, phase: Cancelled, clusters: []string{"a", "b", "", ""},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plan, _ := Advance(c.rec, c.states, c.leaving, t0.Add(time.Minute))
			if !slices.Equal(plan.Started, c.started) || !slices.Equal(plan.Create, c.create) || plan.Ended != c.ended {
				t.Errorf("plan %+v, want started %v, create %v, ended %v", plan, c.started, c.create, c.ended)
			}
			if c.rec.Phase != c.phase || c.rec.Best != c.best {
				t.Errorf("sweep %s (best %d): %s; want %s (best %d)", c.rec.Phase, c.rec.Best, c.rec.Message, c.phase, c.best)
			}
			var clusters []string
			for _, tr := range c.rec.Trials {
				clusters = append(clusters, tr.Cluster)
			}
			if !slices.Equal(clusters, c.clusters) {
				t.Errorf("clusters %q, want %q", clusters, c.clusters)
			}
			if c.ended && (!c.rec.Claim(t0.Add(time.Minute)) || c.rec.Claim(t0.Add(time.Minute))) {
				t.Error("an ended sweep's event is not claimed once")
			}
		})
	}
}

// TestAdvanceNotes: what the trials' runs say is noted once; noting it
// again changes nothing.
func TestAdvanceNotes(t *testing.T) {
	r := started(sweepOf(t, 2, nil), "a", "b")
	st := map[string]TrialState{
		TrialRunID("sw-1", 1): {Exists: true, Phase: runs.Running, EvalLosses: []float64{2, 1.5}, Steps: 20, GPUHours: 1.5},
		TrialRunID("sw-1", 2): {Exists: true, Phase: runs.Running},
	}
	if _, changed := Advance(r, st, "", t0); !changed {
		t.Fatal("nothing noted")
	}
	if tr := r.Trials[0]; !slices.Equal(tr.EvalLosses, []float64{2, 1.5}) || tr.Steps != 20 || tr.GPUHours != 1.5 {
		t.Errorf("noted %+v", tr)
	}
	if _, changed := Advance(r, st, "", t0); changed {
		t.Error("the same states noted twice")
	}
}

func TestMedianStop(t *testing.T) {
	r := sweepOf(t, 5, func(w *spec.Sweep) { w.EarlyStopping = spec.EarlyStopping{Rule: "median", MinTrials: 2} })
	r.Trials[0].EvalLosses = []float64{2.0, 1.6}
	r.Trials[1].EvalLosses = []float64{2.2, 1.4}
	r.Trials[2].EvalLosses = []float64{1.9}
	me := TrialRunID("sw-1", 4)
	for _, c := range []struct {
		losses []float64
		stop   bool
	}{
		{[]float64{2.5}, true},        // worse than the median 2.0 of three
		{[]float64{2.0}, false},       // at the median: goes on
		{[]float64{1.0, 1.7}, true},   // checkpoint 2: median of 1.6 and 1.4 is 1.5
		{[]float64{1, 1, 9}, false},   // no other trial reached checkpoint 3
		{nil, false},                  // no checkpoint yet
		{[]float64{1.0, 1.45}, false}, // better than the median
	} {
		why := MedianStop(r, me, c.losses)
		if (why != "") != c.stop {
			t.Errorf("losses %v: stop %q, want %v", c.losses, why, c.stop)
		}
		if why != "" && !strings.Contains(why, "median") {
			t.Errorf("reason %q does not say the median", why)
		}
	}
	r.Spec.Sweep.EarlyStopping.Rule = "none"
	if MedianStop(r, me, []float64{9}) != "" {
		t.Error("rule none stopped a trial")
	}
}

func TestTrialRunID(t *testing.T) {
	if got := TrialRunID("lr-grid-0123456789ab", 7); got != "lr-grid-0123456789ab-t007" {
		t.Errorf("TrialRunID = %s", got)
	}
	long := strings.Repeat("a", 40)
	a, b := TrialRunID(long, 100), TrialRunID(long[:39]+"b", 100)
	if len(a) > 40 || spec.CheckRunID(a) != "" || a == b {
		t.Errorf("long sweep IDs: %s, %s", a, b)
	}
}
