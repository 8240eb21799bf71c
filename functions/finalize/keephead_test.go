package finalize

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/functions/monitor"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
)

// headPod puts the cluster's head pod in the fake API server.
func headPod(t *testing.T, w *pipelinetest.World, name string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{
		names.LabelRayCluster: "gemma3-tuning", names.LabelRayNodeType: "head"}}}
	if _, err := w.Deps.Kube.Pods("default").Create(w.Ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestFailedRunKeepsItsHead: a failed run whose spec keeps its head for a
// look scales its workers to zero, keeps the cluster (a queued run waits)
// and records its head pod and until when; without the setting, or for a
// run that succeeded, the cluster passes on as always.
func TestFailedRunKeepsItsHead(t *testing.T) {
	keep := func(m map[string]any) { m["debug"] = map[string]any{"keepFailedFor": "30m"} }
	failed := runs.Ending{Outcome: runs.OutcomeFailed, Reason: runs.Stalled, Message: "stalled: no progress"}
	for _, c := range []struct {
		name   string
		edit   func(map[string]any)
		ending runs.Ending
		kept   bool
	}{
		{"failed, kept", keep, failed, true},
		{"failed, not asked", nil, failed, false},
		{"succeeded, asked", keep, succeeded, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := pipelinetest.New(t)
			r := w.NewRun("run-1", w.Spec(c.edit), runs.Finishing, c.ending)
			w.Bring(r)
			w.WriteLayout(r, 1, 3, "succeeded")
			headPod(t, w, "gemma3-tuning-head-abcde")
			next := runs.NewRecord("run-2", "test", "b", w.Spec(nil), nil, w.Now)
			if err := next.MarkQueued("run-1", w.Now); err != nil {
				t.Fatal(err)
			}
			w.Put(next)
			if _, err := w.Deps.Leases.Acquire(w.Ctx, "default", "gemma3-tuning", "run-2"); err != nil {
				t.Fatal(err)
			}
			e := w.StepEvent(w.Deps.Config.Topics.Finished, pipeline.Step{RunID: "run-1", Attempt: 1})
			if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e); err != nil {
				t.Fatal(err)
			}
			rec := w.Record("run-1")
			l, err := w.Deps.Leases.Get(w.Ctx, "default", "gemma3-tuning")
			if err != nil {
				t.Fatal(err)
			}
			if !c.kept {
				if rec.HeadKept != nil || l.Holder != "run-2" {
					t.Fatalf("head kept %+v, lease held by %q; want the cluster passed to run-2", rec.HeadKept, l.Holder)
				}
				return
			}
			k := rec.HeadKept
			if rec.Phase != runs.Failed || k == nil || k.Pod != "gemma3-tuning-head-abcde" || !k.Until.Equal(rec.Times[runs.Failed].Add(30*time.Minute)) || k.ReleasedAt != nil {
				t.Fatalf("run %s, head kept %+v", rec.Phase, k)
			}
			if l.Holder != "run-1" || w.Workers() != 0 || w.Record("run-2").Phase != runs.Queued {
				t.Fatalf("lease held by %q, %d workers, run-2 %s; want run-1's, 0, QUEUED", l.Holder, w.Workers(), w.Record("run-2").Phase)
			}
			if !rec.KeepsHead(w.Now.Add(29*time.Minute)) || rec.KeepsHead(w.Now.Add(31*time.Minute)) {
				t.Fatal("kept for other than 30 minutes")
			}
			// The monitor's sweep passes the cluster on once the time is
			// up, not before: the head pod deleted, then the lease.
			sweep := func(at time.Duration) (*runs.Record, string, error) {
				w.Now = rec.Times[runs.Failed].Add(at)
				if err := (&monitor.Handler{Deps: w.Deps}).Sweep(w.Ctx); err != nil {
					t.Fatal(err)
				}
				l, err := w.Deps.Leases.Get(w.Ctx, "default", "gemma3-tuning")
				if err != nil {
					t.Fatal(err)
				}
				_, err = w.Deps.Kube.Pods("default").Get(w.Ctx, k.Pod, metav1.GetOptions{})
				return w.Record("run-1"), l.Holder, err
			}
			if r, holder, err := sweep(29 * time.Minute); holder != "run-1" || err != nil || r.HeadKept.ReleasedAt != nil {
				t.Fatalf("before its time: lease held by %q, head pod %v, kept %+v", holder, err, r.HeadKept)
			}
			r, holder, err := sweep(30*time.Minute + time.Second)
			if holder != "run-2" || !apierrors.IsNotFound(err) || r.HeadKept.ReleasedAt == nil || w.Record("run-2").Phase != runs.Provisioned {
				t.Fatalf("after its time: lease held by %q, head pod %v, kept %+v, run-2 %s", holder, err, r.HeadKept, w.Record("run-2").Phase)
			}
		})
	}
}
