package finalize

import (
	"context"
	"encoding/json"
	"net/http"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"google.golang.org/api/googleapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
)

var (
	succeeded = runs.Ending{Outcome: runs.OutcomeSucceeded}
	cancelled = runs.Ending{Outcome: runs.OutcomeCancelled, Reason: runs.ReasonCancelled, Message: "cancelled"}
)

// TestFinalize: one row per way a finished message can find the run and
// its cluster, the deliveries made (a redelivery repeats the message), and
// the writes expected after: the record, its checkpoints and report, the
// public events, the cluster's workers and who holds it.
func TestFinalize(t *testing.T) {
	const id = "run-1"
	finished := func(w *pipelinetest.World) event.Event {
		return w.StepEvent(w.Deps.Config.Topics.Finished, pipeline.Step{RunID: id, Attempt: 1})
	}
	// finishing puts the run FINISHING with ending e, its cluster up and
	// its attempt's layout written (epochs checkpoints; mark status).
	finishing := func(w *pipelinetest.World, e runs.Ending, epochs int, status string) *runs.Record {
		r := w.NewRun(id, w.Spec(nil), runs.Finishing, e)
		w.Bring(r)
		w.WriteLayout(r, 1, epochs, status)
		return r
	}
	cases := []struct {
		name   string
		before func(w *pipelinetest.World) event.Event
		n      int // deliveries (default 1)
		// between runs after each delivery but the last.
		between func(w *pipelinetest.World)
		// want
		phase       runs.Phase
		reason      runs.Reason
		checkpoints int
		report      bool
		noReport    string // a part of the record's NoReport
		events      []string
		provisioned []string // runId/attempt
		workers     int32    // -1: no RayCluster
		holder      string
		rayJobs     int
		errs        []string
	}{
		{
			name: "a success: its checkpoints, the workers to zero, the terminal event, then the report and its event",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "delivered twice: each event once, the record ended once",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				return finished(w)
			},
			n:     2,
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{"", ""},
		},
		{
			name: "a success without a complete checkpoint fails (NoCheckpoint)",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 0, "succeeded")
				return finished(w)
			},
			phase: runs.Failed, reason: runs.NoCheckpoint, report: true, events: []string{"run-1:failed", "run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "a queued run waits: the cluster is handed to it, workers kept",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				next := runs.NewRecord("run-2", "test", "b", w.Spec(nil), nil, w.Now)
				if err := next.MarkQueued(id, w.Now); err != nil {
					t.Fatal(err)
				}
				next.MarkPublished(runs.Accepted)
				next.MarkPublished(runs.Queued)
				w.Put(next)
				if _, err := w.Deps.Leases.Acquire(w.Ctx, "default", "gemma3-tuning", "run-2"); err != nil {
					t.Fatal(err)
				}
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, provisioned: []string{"run-2/1"},
			workers: 2, holder: "run-2", errs: []string{""},
		},
		{
			name: "a queued run that has ended is passed over: the workers to zero",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				if _, err := w.Deps.Leases.Acquire(w.Ctx, "default", "gemma3-tuning", "run-2"); err != nil {
					t.Fatal(err)
				}
				w.Put(runs.NewRecord("run-2", "test", "b", nil, nil, w.Now)) // REJECTED
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "a cancelled run: its RayJob deleted, the workers to zero",
			before: func(w *pipelinetest.World) event.Event {
				r := finishing(w, cancelled, 1, "")
				job := w.Deps.Ray.RayV1().RayJobs("default")
				if _, err := job.Create(w.Ctx, rayJob(names.RayJob(r.RunID, 1)), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				return finished(w)
			},
			phase: runs.Cancelled, reason: runs.ReasonCancelled, checkpoints: 1, report: true, events: []string{"run-1:cancelled", "run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "a mark that is not JSON: the run fails (CheckpointsUnreadable) and its cluster goes back",
			before: func(w *pipelinetest.World) event.Event {
				r := finishing(w, succeeded, 3, "")
				bucket, exp := experiment(r)
				w.Write(bucket, exp+"/raydrop_result.json", "{not json")
				return finished(w)
			},
			phase: runs.Failed, reason: runs.CheckpointsUnreadable, report: true, events: []string{"run-1:failed", "run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "the terminal event cannot be published: retried, published once, the report after it",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.FailPublish(w.Deps.Config.Topics.Events, pipelinetest.ErrUnavailable)
				return finished(w)
			},
			n:     2,
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{"transient", ""},
		},
		{
			name: "the record cannot be written: retried, then ended",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.Runs.Fail("update", pipelinetest.ErrUnavailable)
				return finished(w)
			},
			n:     2,
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{"transient", ""},
		},
		{
			name: "the report's event cannot be published: the terminal event stands, the report is announced once on the retry",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.FailPublishAfter(w.Deps.Config.Topics.Events, 1, pipelinetest.ErrUnavailable)
				return finished(w)
			},
			n:     2,
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{"transient", ""},
		},
		{
			name: "the report cannot be written for now: the terminal event stands, the report on the retry",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.Deps.Objects = &failingCreate{Objects: w.Deps.Objects, errs: []error{pipelinetest.ErrUnavailable}}
				return finished(w)
			},
			n:     2,
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:succeeded", "run-1:report_ready"}, workers: 0, errs: []string{"transient", ""},
		},
		{
			name: "the report may not be written (403): no report and no report event, the run announced",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.Deps.Objects = &failingCreate{Objects: w.Deps.Objects, errs: []error{&googleapi.Error{Code: http.StatusForbidden, Message: "storage.objects.create denied"}}}
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, noReport: "storage.objects.create denied", events: []string{"run-1:succeeded"}, workers: 0, errs: []string{""},
		},
		{
			name: "a delivery died after the terminal event, before the report: the next writes and announces it, the terminal event not again",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				w.Deps.Objects = &failingCreate{Objects: w.Deps.Objects, errs: []error{context.Canceled}}
				if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, finished(w)); err == nil {
					t.Fatal("the delivery that was to die did not fail")
				}
				if got := w.Events(); !slices.Equal(got, []string{"run-1:succeeded"}) {
					t.Fatalf("events before the report %q", got)
				}
				if r := w.Record(id); !r.Unannounced() || r.Report != "" {
					t.Fatalf("after the terminal event, the record is announced (%v) or has a report %q", !r.Unannounced(), r.Report)
				}
				w.Reset()
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, report: true, events: []string{"run-1:report_ready"}, workers: 0, errs: []string{""},
		},
		{
			name: "an ended, announced run: nothing happens",
			before: func(w *pipelinetest.World) event.Event {
				finishing(w, succeeded, 3, "succeeded")
				if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, finished(w)); err != nil {
					t.Fatal(err)
				}
				w.Reset()
				return finished(w)
			},
			phase: runs.Succeeded, checkpoints: 3, report: true, workers: 0, errs: []string{""},
		},
		{
			name: "a run rejected at intake: announced, nothing to release",
			before: func(w *pipelinetest.World) event.Event {
				r := runs.NewRecord(id, "test", "a", nil, nil, w.Now)
				w.Put(r)
				return w.StepEvent(w.Deps.Config.Topics.Finished, pipeline.Step{RunID: id})
			},
			phase: runs.Rejected, reason: runs.InvalidSpec, events: []string{"run-1:rejected"}, workers: -1, errs: []string{""},
		},
		{
			name:   "a run with no record: never retried",
			before: finished,
			errs:   []string{"permanent"}, workers: -1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			e := c.before(w)
			var errs []string
			n := max(c.n, 1)
			for i := range n {
				errs = append(errs, pipelinetest.ErrKind((&Handler{Deps: w.Deps}).Handle(w.Ctx, e)))
				if i < n-1 && c.between != nil {
					c.between(w)
				}
			}
			if !slices.Equal(errs, c.errs) {
				t.Errorf("deliveries answered %q, want %q", errs, c.errs)
			}
			if c.phase != "" {
				r := w.Record(id)
				if r.Phase != c.phase || r.Reason != c.reason {
					t.Errorf("record is %s (%s: %s), want %s (%s)", r.Phase, r.Reason, r.Message, c.phase, c.reason)
				}
				got := 0
				if r.Result != nil {
					got = len(r.Result.Checkpoints)
				}
				if got != c.checkpoints {
					t.Errorf("record names %d checkpoints, want %d", got, c.checkpoints)
				}
				if (r.Report != "") != c.report {
					t.Errorf("record's report %q, want one: %v", r.Report, c.report)
				}
				if c.report && r.Report != report.URI(r) {
					t.Errorf("record's report %q, not %q", r.Report, report.URI(r))
				}
				if c.noReport != "" && !strings.Contains(r.NoReport, c.noReport) || c.noReport == "" && r.NoReport != "" {
					t.Errorf("record's NoReport %q, want %q in it", r.NoReport, c.noReport)
				}
				if r.Unannounced() || len(r.Publishing) > 0 {
					t.Errorf("record left unannounced (claims %v)", r.Publishing)
				}
			}
			if got := w.Events(); !slices.Equal(got, c.events) {
				t.Errorf("events %q, want %q", got, c.events)
			}
			// The terminal event does not wait for the report: it names
			// none; the report's event names it.
			for _, m := range w.Sent(w.Deps.Config.Topics.Events) {
				var data events.Run
				if err := json.Unmarshal(m.Data, &data); err != nil {
					t.Fatal(err)
				}
				switch {
				case data.Phase == events.ReportReady && (data.Report == "" || data.Report != w.Record(id).Report || data.Outcome != strings.ToLower(string(c.phase))):
					t.Errorf("report_ready event names report %q, outcome %q; want %q, %s", data.Report, data.Outcome, w.Record(id).Report, strings.ToLower(string(c.phase)))
				case data.Phase != events.ReportReady && data.Report != "":
					t.Errorf("%s event names report %q, written after it", data.Phase, data.Report)
				}
			}
			if got := w.Steps(w.Deps.Config.Topics.Provisioned); !slices.Equal(got, c.provisioned) {
				t.Errorf("provisioned messages %q, want %q", got, c.provisioned)
			}
			if got := w.Workers(); got != c.workers {
				t.Errorf("RayCluster workers %d, want %d (-1: no RayCluster)", got, c.workers)
			}
			l, err := w.Deps.Leases.Get(w.Ctx, "default", "gemma3-tuning")
			if err != nil {
				t.Fatal(err)
			}
			if l.Holder != c.holder {
				t.Errorf("lease held by %q, want %q", l.Holder, c.holder)
			}
			jobs, err := w.Ray.RayV1().RayJobs("default").List(w.Ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs.Items) != c.rayJobs {
				t.Errorf("%d RayJobs left, want %d", len(jobs.Items), c.rayJobs)
			}
		})
	}
}

// failingCreate fails the next creates of objects with errs, in turn.
// failingCreate fails the report's creates with errs, in turn.
type failingCreate struct {
	pipeline.Objects
	errs []error
}

func (f *failingCreate) Create(ctx context.Context, bucket, name string, data []byte, contentType string) error {
	if len(f.errs) > 0 && path.Base(name) == report.File {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return err
	}
	return f.Objects.Create(ctx, bucket, name, data, contentType)
}

func experiment(r *runs.Record) (bucket, prefix string) {
	return manifests.Experiment(r.Spec, r.RunID, 1)
}

func rayJob(name string) *rayv1.RayJob {
	return &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
}
