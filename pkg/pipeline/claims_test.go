package pipeline_test

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
)

var t0 = pipelinetest.T0

// history is a record that entered phases in order, each a second apart,
// with the events of published gone out and claims (phase → age) held.
func history(phases []runs.Phase, published []runs.Phase, claims map[runs.Phase]time.Duration) *runs.Record {
	r := &runs.Record{RunID: "r", Phase: phases[len(phases)-1]}
	for i, p := range phases {
		r.History = append(r.History, runs.Entry{Phase: p, At: t0.Add(time.Duration(i) * time.Second)})
	}
	for _, p := range published {
		r.MarkPublished(p)
	}
	if len(claims) > 0 {
		r.Publishing = map[runs.Phase]time.Time{}
		for p, age := range claims {
			r.Publishing[p] = t0.Add(time.Minute - age)
		}
	}
	return r
}

// TestClaimExpiresBeforeAStepIsStale: a claim left by a dead delivery has
// expired by the time the sweep retries its step, so the retry may publish.
func TestClaimExpiresBeforeAStepIsStale(t *testing.T) {
	if pipeline.ClaimFor >= runs.StaleStep {
		t.Fatalf("ClaimFor %s is not shorter than runs.StaleStep %s", pipeline.ClaimFor, runs.StaleStep)
	}
}

// TestClaimOwed: the events a delivery claims, in the order the run
// entered their phases, stopping before one another delivery holds a
// fresh claim to, so that no event overtakes an earlier one.
func TestClaimOwed(t *testing.T) {
	now := t0.Add(time.Minute)
	fresh, stale := time.Second, pipeline.ClaimFor+time.Second
	running := []runs.Phase{runs.Accepted, runs.Provisioned, runs.Submitted, runs.Running}
	ended := append(slices.Clone(running), runs.Finishing, runs.Succeeded)
	cases := []struct {
		name      string
		rec       *runs.Record
		claimed   []runs.Phase
		held      bool
		pending   []runs.Phase // ClaimPending's, on a copy
		claimedAt map[runs.Phase]time.Time
	}{
		{"nothing published", history(running, nil, nil), []runs.Phase{runs.Accepted, runs.Running}, false, []runs.Phase{runs.Accepted, runs.Running},
			map[runs.Phase]time.Time{runs.Accepted: now, runs.Running: now}},
		{"accepted gone out", history(running, []runs.Phase{runs.Accepted}, nil), []runs.Phase{runs.Running}, false, []runs.Phase{runs.Running},
			map[runs.Phase]time.Time{runs.Running: now}},
		{"all gone out", history(running, []runs.Phase{runs.Accepted, runs.Running}, nil), nil, false, nil, nil},
		{"a fresh claim on the later event: the earlier one only", history(running, nil, map[runs.Phase]time.Duration{runs.Running: fresh}),
			[]runs.Phase{runs.Accepted}, true, []runs.Phase{runs.Accepted},
			map[runs.Phase]time.Time{runs.Accepted: now, runs.Running: now.Add(-fresh)}},
		{"a fresh claim on the earlier event: nothing, not even the later", history(running, nil, map[runs.Phase]time.Duration{runs.Accepted: fresh}),
			nil, true, nil, map[runs.Phase]time.Time{runs.Accepted: now.Add(-fresh)}},
		{"a stale claim (its delivery died) is taken over", history(running, nil, map[runs.Phase]time.Duration{runs.Accepted: stale}),
			[]runs.Phase{runs.Accepted, runs.Running}, false, []runs.Phase{runs.Accepted, runs.Running},
			map[runs.Phase]time.Time{runs.Accepted: now, runs.Running: now}},
		{"an ended run: the terminal event last; ClaimPending leaves it to finalize", history(ended, []runs.Phase{runs.Accepted}, nil),
			[]runs.Phase{runs.Running, runs.Succeeded}, false, nil,
			map[runs.Phase]time.Time{runs.Running: now, runs.Succeeded: now}},
		{"a phase entered twice (a retry) is claimed once", history([]runs.Phase{runs.Accepted, runs.Provisioned, runs.Running, runs.Provisioned, runs.Running}, nil, nil),
			[]runs.Phase{runs.Accepted, runs.Running}, false, []runs.Phase{runs.Accepted, runs.Running},
			map[runs.Phase]time.Time{runs.Accepted: now, runs.Running: now}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cp := *c.rec
			cp.Publishing = maps.Clone(c.rec.Publishing)
			claimed, held := pipeline.ClaimOwed(c.rec, now)
			if !slices.Equal(claimed, c.claimed) || held != c.held {
				t.Errorf("ClaimOwed = %v, held %v; want %v, %v", claimed, held, c.claimed, c.held)
			}
			if !maps.EqualFunc(c.rec.Publishing, c.claimedAt, time.Time.Equal) && (len(c.rec.Publishing) > 0 || len(c.claimedAt) > 0) {
				t.Errorf("claims in the record %v, want %v", c.rec.Publishing, c.claimedAt)
			}
			if got := pipeline.ClaimPending(&cp, now); !slices.Equal(got, c.pending) {
				t.Errorf("ClaimPending = %v, want %v", got, c.pending)
			}
		})
	}
}

// TestAnnounceAndAdvance: over the real run store, the events a delivery
// publishes and what the record says after, when the publisher or the
// store fails, or another delivery holds a claim.
func TestAnnounceAndAdvance(t *testing.T) {
	cases := []struct {
		name string
		// prepare puts the run (ACCEPTED, then RUNNING for advance) and
		// faults in the world.
		prepare func(w *pipelinetest.World)
		act     func(w *pipelinetest.World) error
		// want
		events    []string
		published []runs.Phase
		claims    []runs.Phase
		err       bool
	}{
		{
			name: "announce: claimed, published, recorded",
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Accepted)
				return err
			},
			events:    []string{"r:accepted"},
			published: []runs.Phase{runs.Accepted},
		},
		{
			name: "announce twice: once",
			act: func(w *pipelinetest.World) error {
				if _, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Accepted); err != nil {
					return err
				}
				_, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Accepted)
				return err
			},
			events:    []string{"r:accepted"},
			published: []runs.Phase{runs.Accepted},
		},
		{
			name: "announce while another delivery holds the claim: retried, nothing sent",
			prepare: func(w *pipelinetest.World) {
				if _, err := w.Deps.Runs.Update(w.Ctx, "r", func(r *runs.Record) error {
					r.Publishing = map[runs.Phase]time.Time{runs.Accepted: w.Now}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Accepted)
				return err
			},
			claims: []runs.Phase{runs.Accepted},
			err:    true,
		},
		{
			name:    "announce when Pub/Sub fails: the claim given up at once, retried",
			prepare: func(w *pipelinetest.World) { w.FailPublish(w.Deps.Config.Topics.Events, pipelinetest.ErrUnavailable) },
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Accepted)
				return err
			},
			err: true,
		},
		{
			name: "announce a phase without an event: refused for good",
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Announce(w.Ctx, w.Record("r"), runs.Provisioned)
				if !pipeline.IsPermanent(err) {
					t.Errorf("announcing PROVISIONED: %v, not a permanent error", err)
				}
				return err
			},
			err: true,
		},
		{
			name: "advance: the transition and its events in one write",
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Advance(w.Ctx, "r", func(r *runs.Record) error { return r.MarkQueued("other", w.Now) })
				return err
			},
			events:    []string{"r:accepted", "r:queued"},
			published: []runs.Phase{runs.Accepted, runs.Queued},
		},
		{
			name: "advance with no change still sends what is owed",
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Advance(w.Ctx, "r", func(*runs.Record) error { return runs.ErrNoChange })
				return err
			},
			events:    []string{"r:accepted"},
			published: []runs.Phase{runs.Accepted},
		},
		{
			name:    "advance when the store fails: nothing sent",
			prepare: func(w *pipelinetest.World) { w.Runs.Fail("update", pipelinetest.ErrUnavailable) },
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Advance(w.Ctx, "r", func(r *runs.Record) error { return r.MarkQueued("other", w.Now) })
				return err
			},
			err: true,
		},
		{
			name: "advance when the second of two events fails: the first recorded, the second's claim given up",
			prepare: func(w *pipelinetest.World) {
				w.FailPublishAfter(w.Deps.Config.Topics.Events, 1, pipelinetest.ErrUnavailable)
			},
			act: func(w *pipelinetest.World) error {
				_, err := w.Deps.Advance(w.Ctx, "r", func(r *runs.Record) error { return r.MarkQueued("other", w.Now) })
				return err
			},
			events:    []string{"r:accepted"},
			published: []runs.Phase{runs.Accepted},
			err:       true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			w.Put(runs.NewRecord("r", "test", "a", w.Spec(nil), nil, w.Now))
			if c.prepare != nil {
				c.prepare(w)
			}
			err := c.act(w)
			if (err != nil) != c.err {
				t.Errorf("error %v, want one: %v", err, c.err)
			}
			if err != nil && errors.Is(err, runs.ErrNoChange) {
				t.Errorf("ErrNoChange leaked: %v", err)
			}
			if got := w.Events(); !slices.Equal(got, c.events) {
				t.Errorf("events %q, want %q", got, c.events)
			}
			r := w.Record("r")
			var published, claims []runs.Phase
			for _, p := range runs.Phases() {
				if r.WasPublished(p) {
					published = append(published, p)
				}
				if _, ok := r.Publishing[p]; ok {
					claims = append(claims, p)
				}
			}
			if !slices.Equal(published, c.published) || !slices.Equal(claims, c.claims) {
				t.Errorf("record has %v published, %v claimed; want %v, %v", published, claims, c.published, c.claims)
			}
		})
	}
}

// TestAnnounceReport: a run's report is recorded and announced once, only
// after its terminal event; a claim another delivery holds is retried.
func TestAnnounceReport(t *testing.T) {
	const uri = "gs://out/raydrop/r/report.html"
	// ended puts run r FAILED (no checkpoint), its terminal event out when
	// announced.
	ended := func(w *pipelinetest.World, announced bool) {
		w.NewRun("r", w.Spec(nil), runs.Finishing, runs.Ending{Outcome: runs.OutcomeSucceeded})
		if _, err := w.Deps.Runs.Update(w.Ctx, "r", func(r *runs.Record) error {
			if err := r.MarkEnded(&checkpoints.Result{}, nil, w.Now); err != nil {
				return err
			}
			if announced {
				r.MarkPublished(r.Phase)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name      string
		announced bool
		prepare   func(w *pipelinetest.World)
		times     int
		events    []string
		reported  bool
		err       string
	}{
		{name: "once the terminal event is out: recorded, announced", announced: true, times: 1, events: []string{"r:report_ready"}, reported: true},
		{name: "twice: announced once", announced: true, times: 2, events: []string{"r:report_ready"}, reported: true},
		{name: "before the terminal event: refused for good", times: 1, err: "permanent"},
		{
			name: "another delivery holds the claim: recorded, retried, nothing sent", announced: true, times: 1, err: "transient",
			prepare: func(w *pipelinetest.World) {
				if _, err := w.Deps.Runs.Update(w.Ctx, "r", func(r *runs.Record) error {
					r.Publishing = map[runs.Phase]time.Time{runs.ReportReady: w.Now}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			ended(w, c.announced)
			if c.prepare != nil {
				c.prepare(w)
			}
			var err error
			for range c.times {
				if _, err = w.Deps.AnnounceReport(w.Ctx, "r", uri); err != nil {
					break
				}
			}
			if got := pipelinetest.ErrKind(err); got != c.err {
				t.Errorf("AnnounceReport: %q (%v), want %q", got, err, c.err)
			}
			if got := w.Events(); !slices.Equal(got, c.events) {
				t.Errorf("events %q, want %q", got, c.events)
			}
			r := w.Record("r")
			if r.WasPublished(runs.ReportReady) != c.reported || c.reported && (r.Report != uri || r.Unannounced()) {
				t.Errorf("record: report %q, report_ready published %v, unannounced %v; want published %v", r.Report, r.WasPublished(runs.ReportReady), r.Unannounced(), c.reported)
			}
		})
	}
}
