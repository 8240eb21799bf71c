package provision

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// provisionWant is the world after the deliveries: the run's record (no
// phase: none was written), the public events and step messages sent, and
// the RayCluster's workers (-1: no RayCluster).
type provisionWant struct {
	phase       runs.Phase
	attempt     int
	cancel      bool
	problem     string // a problem the record names, by its path
	events      []string
	provisioned []string
	submitted   []string
	workers     int32
	// errs is the handler's answer to each delivery: "" (acknowledged),
	// "transient" (redelivered) or "permanent" (acknowledged and logged).
	errs []string
}

// TestProvision: one row per way an intake event can find the world, the
// deliveries it makes (a redelivery repeats the event), and the writes
// expected after. "R" in the wanted events and steps stands for the run's
// ID.
func TestProvision(t *testing.T) {
	upload := func(w *pipelinetest.World, edit func(map[string]any)) func() event.Event {
		body := string(w.SpecJSON(edit))
		var e *event.Event
		return func() event.Event { // one upload, delivered as often as asked
			if e == nil {
				u := w.Upload("jobs/a.json", body)
				e = &u
			}
			return *e
		}
	}
	check := func(m map[string]any) { m["dataset"] = map[string]any{"check": true} }
	cases := []struct {
		name   string
		before func(w *pipelinetest.World) func() event.Event
		// between runs after each delivery but the last.
		between func(w *pipelinetest.World)
		n       int // deliveries (default 1)
		want    provisionWant
	}{
		{
			name:   "a new spec, the cluster free",
			before: func(w *pipelinetest.World) func() event.Event { return upload(w, nil) },
			want:   provisionWant{phase: runs.Provisioned, attempt: 1, events: []string{"R:accepted"}, provisioned: []string{"R/1"}, workers: 2, errs: []string{""}},
		},
		{
			name:   "a new spec that asks for the data check: the head alone",
			before: func(w *pipelinetest.World) func() event.Event { return upload(w, check) },
			want:   provisionWant{phase: runs.Checking, events: []string{"R:accepted", "R:checking"}, provisioned: []string{"R/0"}, workers: 0, errs: []string{""}},
		},
		{
			name: "the cluster held by another run: queued behind it",
			before: func(w *pipelinetest.World) func() event.Event {
				if _, err := w.Deps.Leases.Acquire(w.Ctx, "default", "gemma3-tuning", "other-run"); err != nil {
					t.Fatal(err)
				}
				return upload(w, nil)
			},
			want: provisionWant{phase: runs.Queued, events: []string{"R:accepted", "R:queued"}, workers: -1, errs: []string{""}},
		},
		{
			name: "an invalid spec: rejected once, never retried",
			before: func(w *pipelinetest.World) func() event.Event {
				return upload(w, func(m map[string]any) { m["training"] = map[string]any{"epochs": -1} })
			},
			want: provisionWant{phase: runs.Rejected, problem: "training.epochs", events: []string{"R:rejected"}, workers: -1, errs: []string{""}},
		},
		{
			name: "a checkpoint bucket the deployment does not have",
			before: func(w *pipelinetest.World) func() event.Event {
				return upload(w, func(m map[string]any) { m["output"] = map[string]any{"bucket": "elsewhere"} })
			},
			want: provisionWant{phase: runs.Rejected, problem: "output.bucket", events: []string{"R:rejected"}, workers: -1, errs: []string{""}},
		},
		{
			name: "an object outside jobs/ is ignored",
			before: func(w *pipelinetest.World) func() event.Event {
				e := w.Upload("notes/a.json", "{}")
				return func() event.Event { return e }
			},
			want: provisionWant{workers: -1, errs: []string{""}},
		},
		{
			name:   "the same object delivered twice: one run, each event once",
			before: func(w *pipelinetest.World) func() event.Event { return upload(w, nil) },
			n:      2,
			want:   provisionWant{phase: runs.Provisioned, attempt: 1, events: []string{"R:accepted"}, provisioned: []string{"R/1"}, workers: 2, errs: []string{"", ""}},
		},
		{
			name: "the record cannot be written: retried, then admitted",
			before: func(w *pipelinetest.World) func() event.Event {
				w.Runs.Fail("create", pipelinetest.ErrUnavailable)
				return upload(w, nil)
			},
			n:    2,
			want: provisionWant{phase: runs.Provisioned, attempt: 1, events: []string{"R:accepted"}, provisioned: []string{"R/1"}, workers: 2, errs: []string{"transient", ""}},
		},
		{
			// The first delivery recorded the run PROVISIONED but its
			// event did not go out: the redelivery publishes it, and the
			// provisioned message, never sent, is the sweep's to resend
			// (its record goes stale).
			name: "the accepted event cannot be published: the redelivery publishes it",
			before: func(w *pipelinetest.World) func() event.Event {
				w.FailPublish(w.Deps.Config.Topics.Events, pipelinetest.ErrUnavailable)
				return upload(w, nil)
			},
			n:    2,
			want: provisionWant{phase: runs.Provisioned, attempt: 1, events: []string{"R:accepted"}, workers: 2, errs: []string{"transient", ""}},
		},
		{
			name: "a cancellation object for a running run",
			before: func(w *pipelinetest.World) func() event.Event {
				r := runs.NewRecord("run-1", "test", "a", w.Spec(nil), nil, w.Now)
				if err := r.MarkProvisioned(runs.Attempt{N: 1, RayJob: names.RayJob("run-1", 1)}, "", w.Now); err != nil {
					t.Fatal(err)
				}
				w.Put(r)
				e := w.Upload("cancel/run-1", "")
				return func() event.Event { return e }
			},
			want: provisionWant{phase: runs.Provisioned, attempt: 1, cancel: true, submitted: []string{"run-1/1"}, workers: -1, errs: []string{""}},
		},
		{
			name: "a cancellation of a run that has ended is ignored",
			before: func(w *pipelinetest.World) func() event.Event {
				w.Put(runs.NewRecord("run-1", "test", "a", nil, nil, w.Now)) // REJECTED
				e := w.MessageEvent(w.Deps.Config.Topics.Requests, nil, map[string]string{"action": "cancel", "runId": "run-1"})
				return func() event.Event { return e }
			},
			want: provisionWant{phase: runs.Rejected, workers: -1, errs: []string{""}},
		},
		{
			name: "a cancellation that names no run",
			before: func(w *pipelinetest.World) func() event.Event {
				e := w.MessageEvent(w.Deps.Config.Topics.Requests, nil, map[string]string{"action": "cancel", "runId": "../x"})
				return func() event.Event { return e }
			},
			want: provisionWant{workers: -1, errs: []string{"permanent"}},
		},
		{
			name: "a request message with its caller's runId",
			before: func(w *pipelinetest.World) func() event.Event {
				e := w.MessageEvent(w.Deps.Config.Topics.Requests, w.SpecJSON(func(m map[string]any) { m["runId"] = "caller-key-1" }), nil)
				return func() event.Event { return e }
			},
			want: provisionWant{phase: runs.Provisioned, attempt: 1, events: []string{"caller-key-1:accepted"}, provisioned: []string{"caller-key-1/1"}, workers: 2, errs: []string{""}},
		},
		{
			name: "an event of another type",
			before: func(w *pipelinetest.World) func() event.Event {
				e := event.New()
				e.SetID("1")
				e.SetType("google.cloud.storage.object.v1.deleted")
				e.SetSource("//storage.googleapis.com/projects/_/buckets/" + pipelinetest.Intake)
				return func() event.Event { return e }
			},
			want: provisionWant{workers: -1, errs: []string{"permanent"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			next := c.before(w)
			n := max(c.n, 1)
			var errs []string
			var runID string
			for i := range n {
				e := next()
				err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e)
				errs = append(errs, pipelinetest.ErrKind(err))
				if runID == "" {
					runID = runOf(t, w, e)
				}
				if i < n-1 && c.between != nil {
					c.between(w)
				}
			}
			if !slices.Equal(errs, c.want.errs) {
				t.Errorf("deliveries answered %q, want %q", errs, c.want.errs)
			}
			checkWorld(t, w, runID, c.want)
		})
	}
}

// runOf is the run ID an intake event makes (or names, for a cancellation).
func runOf(t *testing.T, w *pipelinetest.World, e event.Event) string {
	switch e.Type() {
	case pipeline.StorageFinalized:
		o, err := pipeline.DecodeObject(e)
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := strings.CutPrefix(o.Name, "cancel/"); ok {
			return id
		}
		return names.RunIDFromObject(o.Bucket, o.Name, int64(o.Generation))
	case pipeline.PubSubPublished:
		m, err := pipeline.DecodeMessage(e)
		if err != nil {
			t.Fatal(err)
		}
		if id := m.Message.Attributes["runId"]; id != "" {
			return id
		}
		var peek struct {
			RunID string `json:"runId"`
		}
		_ = json.Unmarshal(m.Message.Data, &peek)
		return peek.RunID
	}
	return ""
}

func checkWorld(t *testing.T, w *pipelinetest.World, runID string, want provisionWant) {
	t.Helper()
	r, err := w.Deps.Runs.Get(w.Ctx, runID)
	switch {
	case want.phase == "" && !errors.Is(err, runs.ErrNotFound):
		t.Errorf("a record was written (%v): %+v", err, r)
	case want.phase != "" && err != nil:
		t.Fatalf("no record: %v", err)
	case want.phase != "":
		if r.Phase != want.phase || r.Attempt != want.attempt || r.CancelRequested != want.cancel {
			t.Errorf("record is %s, attempt %d, cancel requested %v; want %s, %d, %v", r.Phase, r.Attempt, r.CancelRequested, want.phase, want.attempt, want.cancel)
		}
		if want.problem != "" && !slices.ContainsFunc(r.Problems, func(p spec.Problem) bool { return p.Path == want.problem }) {
			t.Errorf("record names problems %+v, none at %s", r.Problems, want.problem)
		}
		if len(r.Publishing) > 0 {
			t.Errorf("claims left in the record: %v", r.Publishing)
		}
	}
	sub := func(list []string) []string {
		var out []string
		for _, s := range list {
			out = append(out, strings.ReplaceAll(s, "R", runID))
		}
		return out
	}
	if got := w.Events(); !slices.Equal(got, sub(want.events)) {
		t.Errorf("events %q, want %q", got, sub(want.events))
	}
	if got := w.Steps(w.Deps.Config.Topics.Provisioned); !slices.Equal(got, sub(want.provisioned)) {
		t.Errorf("provisioned messages %q, want %q", got, sub(want.provisioned))
	}
	if got := w.Steps(w.Deps.Config.Topics.Submitted); !slices.Equal(got, sub(want.submitted)) {
		t.Errorf("submitted messages %q, want %q", got, sub(want.submitted))
	}
	if got := w.Workers(); got != want.workers {
		t.Errorf("RayCluster workers %d, want %d (-1: no RayCluster)", got, want.workers)
	}
}
