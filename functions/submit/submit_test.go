package submit

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestSubmit: one row per way a provisioned message can find the run, the
// deliveries made (a redelivery repeats the message), and the writes
// expected after: the record, the RayJobs, and the messages sent on.
func TestSubmit(t *testing.T) {
	const id = "run-1"
	step := func(w *pipelinetest.World, attempt int) event.Event {
		return w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: id, Attempt: attempt})
	}
	cases := []struct {
		name   string
		before func(w *pipelinetest.World) event.Event
		n      int // deliveries (default 1)
		// want
		phase     runs.Phase
		rayJobs   []string // names
		submitted []string // runId/attempt
		finished  []string
		errs      []string // per delivery: "", "transient", "permanent"
		entry     string   // a string the RayJob's entrypoint holds
		reason    runs.Reason
	}{
		{
			name: "a provisioned attempt: its RayJob, then the monitor told",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				return step(w, 1)
			},
			phase: runs.Submitted, rayJobs: []string{names.RayJob(id, 1)}, submitted: []string{"run-1/1"}, errs: []string{""},
		},
		{
			name: "delivered twice: one RayJob, one message on",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				return step(w, 1)
			},
			n:     2,
			phase: runs.Submitted, rayJobs: []string{names.RayJob(id, 1)}, submitted: []string{"run-1/1"}, errs: []string{"", ""},
		},
		{
			name: "the record write fails after the RayJob: the redelivery finds the RayJob",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				w.Runs.Fail("update", pipelinetest.ErrUnavailable)
				return step(w, 1)
			},
			n:     2,
			phase: runs.Submitted, rayJobs: []string{names.RayJob(id, 1)}, submitted: []string{"run-1/1"}, errs: []string{"transient", ""},
		},
		{
			name: "a message for an attempt the run has left",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Running, runs.Ending{})
				return step(w, 1)
			},
			phase: runs.Running, errs: []string{""},
		},
		{
			name: "cancelled before the job started: no RayJob, the run to finalize",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				if _, err := w.Deps.Runs.Update(w.Ctx, id, func(r *runs.Record) error { return r.MarkCancelRequested() }); err != nil {
					t.Fatal(err)
				}
				return step(w, 1)
			},
			phase: runs.Finishing, reason: runs.ReasonCancelled, finished: []string{"run-1/1"}, errs: []string{""},
		},
		{
			name: "a retry resumes from the checkpoint the record names",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Running, runs.Ending{})
				ck := "gs://" + pipelinetest.Output + "/raydrop/" + id + "/attempt-1/TorchTrainer_abcde/checkpoint_000001/checkpoint"
				if _, err := w.Deps.Runs.Update(w.Ctx, id, func(r *runs.Record) error {
					return r.MarkProvisioned(runs.Attempt{N: 2, RayJob: names.RayJob(id, 2), ResumeFrom: ck}, "node lost", w.Now)
				}); err != nil {
					t.Fatal(err)
				}
				return step(w, 2)
			},
			phase: runs.Submitted, rayJobs: []string{names.RayJob(id, 2)}, submitted: []string{"run-1/2"}, errs: []string{""},
			entry: "attempt-1/TorchTrainer_abcde/checkpoint_000001/checkpoint",
		},
		{
			name: "a checking run: the data check's RayJob; the record stays CHECKING",
			before: func(w *pipelinetest.World) event.Event {
				r := w.NewRun(id, w.Spec(func(m map[string]any) { m["dataset"] = map[string]any{"check": true} }), runs.Accepted, runs.Ending{})
				if _, err := w.Deps.Runs.Update(w.Ctx, r.RunID, func(r *runs.Record) error {
					return r.MarkChecking(names.RayJob(id, manifests.CheckAttempt), w.Now)
				}); err != nil {
					t.Fatal(err)
				}
				return step(w, manifests.CheckAttempt)
			},
			phase: runs.Checking, rayJobs: []string{names.RayJob(id, manifests.CheckAttempt)}, submitted: []string{"run-1/0"}, errs: []string{""},
			entry: "datacheck.py",
		},
		{
			name:   "a run with no record: nothing to submit, never retried",
			before: func(w *pipelinetest.World) event.Event { return step(w, 1) },
			errs:   []string{"permanent"},
		},
		{
			name: "the run store unavailable: retried",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				w.Runs.Fail("get", pipelinetest.ErrUnavailable)
				return step(w, 1)
			},
			phase: runs.Provisioned, errs: []string{"transient"},
		},
		{
			name: "the API server unavailable: retried, then submitted",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				refuse(w, 1, apierrors.NewServiceUnavailable("etcd is down"))
				return step(w, 1)
			},
			n:     2,
			phase: runs.Submitted, rayJobs: []string{names.RayJob(id, 1)}, submitted: []string{"run-1/1"}, errs: []string{"transient", ""},
		},
		{
			// No redelivery, nor the sweep's resend, can make the API
			// server take it: the run fails (InvalidJob) and its cluster
			// goes back, rather than the run staying PROVISIONED.
			name: "the API server refuses the RayJob as invalid: the run fails",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
				refuse(w, 1, apierrors.NewInvalid(schema.GroupKind{Group: "ray.io", Kind: "RayJob"}, names.RayJob(id, 1), nil))
				return step(w, 1)
			},
			phase: runs.Finishing, reason: runs.InvalidJob, finished: []string{"run-1/1"}, errs: []string{""},
		},
		{
			name: "the API server refuses the data check's RayJob as invalid: the run fails",
			before: func(w *pipelinetest.World) event.Event {
				w.NewRun(id, w.Spec(func(m map[string]any) { m["dataset"] = map[string]any{"check": true} }), runs.Accepted, runs.Ending{})
				if _, err := w.Deps.Runs.Update(w.Ctx, id, func(r *runs.Record) error {
					return r.MarkChecking(names.RayJob(id, manifests.CheckAttempt), w.Now)
				}); err != nil {
					t.Fatal(err)
				}
				refuse(w, 1, apierrors.NewInvalid(schema.GroupKind{Group: "ray.io", Kind: "RayJob"}, names.RayJob(id, 0), nil))
				return step(w, manifests.CheckAttempt)
			},
			phase: runs.Finishing, reason: runs.InvalidJob, finished: []string{"run-1/0"}, errs: []string{""},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			e := c.before(w)
			var errs []string
			for range max(c.n, 1) {
				errs = append(errs, pipelinetest.ErrKind((&Handler{Deps: w.Deps}).Handle(w.Ctx, e)))
			}
			if !slices.Equal(errs, c.errs) {
				t.Errorf("deliveries answered %q, want %q", errs, c.errs)
			}
			if c.phase != "" {
				if r := w.Record(id); r.Phase != c.phase || r.Reason != c.reason {
					t.Errorf("record is %s (%s), want %s (%s)", r.Phase, r.Reason, c.phase, c.reason)
				}
			}
			jobs, err := w.Ray.RayV1().RayJobs("default").List(w.Ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, j := range jobs.Items {
				got = append(got, j.Name)
				if c.entry != "" && !strings.Contains(j.Spec.Entrypoint, c.entry) {
					t.Errorf("RayJob %s's entrypoint %q does not hold %q", j.Name, j.Spec.Entrypoint, c.entry)
				}
			}
			if !slices.Equal(got, c.rayJobs) {
				t.Errorf("RayJobs %q, want %q", got, c.rayJobs)
			}
			if got := w.Steps(w.Deps.Config.Topics.Submitted); !slices.Equal(got, c.submitted) {
				t.Errorf("submitted messages %q, want %q", got, c.submitted)
			}
			if got := w.Steps(w.Deps.Config.Topics.Finished); !slices.Equal(got, c.finished) {
				t.Errorf("finished messages %q, want %q", got, c.finished)
			}
		})
	}
}

// refuse makes the API server answer the next n RayJob creations with err.
func refuse(w *pipelinetest.World, n int, err error) {
	w.Ray.PrependReactor("create", "rayjobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		if n == 0 {
			return false, nil, nil
		}
		n--
		return true, nil, err
	})
}

// TestSubmitRecordsWhatProvisionPublished: the provisioned message says
// Provision's accepted event went out (Provision records it in a later
// write of its own); Submit records it in its write, so a job that ends at
// once does not meet the event's claim still held.
func TestSubmitRecordsWhatProvisionPublished(t *testing.T) {
	const id = "run-1"
	w := pipelinetest.New(t)
	w.NewRun(id, w.Spec(nil), runs.Provisioned, runs.Ending{})
	if _, err := w.Deps.Runs.Update(w.Ctx, id, func(r *runs.Record) error {
		r.Published = slices.DeleteFunc(r.Published, func(p runs.Phase) bool { return p == runs.Accepted })
		r.Publishing = map[runs.Phase]time.Time{runs.Accepted: w.Now}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e := w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: id, Attempt: 1, Published: []runs.Phase{runs.Accepted}})
	if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e); err != nil {
		t.Fatal(err)
	}
	r := w.Record(id)
	if r.Phase != runs.Submitted || !r.WasPublished(runs.Accepted) || len(r.Publishing) != 0 {
		t.Errorf("record %s, published %v, claims %v; want SUBMITTED with accepted recorded and no claim", r.Phase, r.Published, r.Publishing)
	}
	if len(w.Events()) != 0 {
		t.Errorf("submit published %v", w.Events())
	}
}
