package flow_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// sweepSpec is the example spec as a grid of learning rates over two
// clusters, with edit applied to its sweep.
func sweepSpec(t *testing.T, rates []float64, edit func(map[string]any)) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(example(t)), &m); err != nil {
		t.Fatal(err)
	}
	sw := map[string]any{
		"parameters":    []any{map[string]any{"path": "training.learningRate", "values": rates}},
		"clusters":      []any{"sweep-a", "sweep-b"},
		"earlyStopping": map[string]any{"rule": "median", "minTrials": 1},
	}
	if edit != nil {
		edit(sw)
	}
	m["sweep"] = sw
	b, _ := json.Marshal(m)
	return string(b)
}

// writeLosses writes an attempt's layout with one checkpoint per held-out
// loss, and the completion mark of status ("": none yet).
func (w *world) writeLosses(runID string, attempt int, losses []float64, status string) {
	w.t.Helper()
	exp := fmt.Sprintf("raydrop/%s/attempt-%d", runID, attempt)
	trial := exp + "/TorchTrainer_abcde_00000_0_2026-11-30_10-00-00"
	var lines []string
	for i, l := range losses {
		ck := fmt.Sprintf("checkpoint_%06d", i)
		for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
			w.put(output, trial+"/"+ck+"/checkpoint/"+f, "x")
		}
		lines = append(lines, fmt.Sprintf(`{"step": %d, "epoch": %d, "loss": %g, "eval_loss": %g, "checkpoint_dir_name": %q}`, (i+1)*10, i+1, l-0.1, l, ck))
	}
	w.put(output, trial+"/result.json", strings.Join(lines, "\n")+"\n")
	if status != "" {
		w.put(output, exp+"/"+checkpoints.MarkFile, fmt.Sprintf(`{"status": %q, "error": null, "finalMetrics": {"train_loss": 1.1}}`, status))
	}
}

func (w *world) sweep(id string) *sweeps.Record {
	w.t.Helper()
	sw, err := w.deps.Sweeps.Get(w.ctx, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return sw
}

// clusterWorkers is the worker replicas (and minReplicas) of a cluster.
func (w *world) clusterWorkers(name string) int32 {
	w.t.Helper()
	rc, err := w.ray.RayV1().RayClusters("default").Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var n int32
	for _, g := range rc.Spec.WorkerGroupSpecs {
		n += *g.Replicas + *g.MinReplicas
	}
	return n
}

// TestSweepWithEarlyStopping: a grid of four learning rates over two
// clusters, each trial a run of its own; a trial whose held-out loss at
// its first checkpoint trails the median is stopped (STOPPED,
// EarlyStopped, its checkpoints kept) and its cluster goes to the next
// trial; the sweep ends once, naming the best trial, with its report.
// The spec dropped twice is one sweep.
func TestSweepWithEarlyStopping(t *testing.T) {
	w := newWorld(t)
	e := w.upload("jobs/lr.json", sweepSpec(t, []float64{1e-4, 2e-4, 4e-4, 8e-4}, nil))
	for range 2 {
		if err := w.deliver("intake", e); err != nil {
			t.Fatal(err)
		}
	}
	w.drain()
	id := names.RunIDFromObject(intake, "jobs/lr.json", mustGen(t, e))
	sw := w.sweep(id)
	if len(sw.Trials) != 4 || sw.Phase != sweeps.Running {
		t.Fatalf("sweep %s with %d trials", sw.Phase, len(sw.Trials))
	}
	trial := func(i int) string { return sweeps.TrialRunID(id, i) }
	for i, cluster := range []string{"sweep-a", "sweep-b"} {
		r := w.record(trial(i + 1))
		if r.Phase != runs.Submitted || r.Cluster != cluster || r.Trial == nil || r.Trial.SweepID != id {
			t.Fatalf("trial %d: %s on %s (%+v)", i+1, r.Phase, r.Cluster, r.Trial)
		}
	}
	if _, err := w.deps.Runs.Get(w.ctx, trial(3)); err == nil {
		t.Fatal("a third trial started with two clusters")
	}
	if got := w.record(trial(2)).Spec.Training.LearningRate; got != 2e-4 {
		t.Errorf("trial 2's learning rate %g", got)
	}

	// Trial 1 runs to its end; its cluster goes to trial 3 without its
	// workers going to zero.
	w.setJob(trial(1), 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLosses(trial(1), 1, []float64{2.0, 1.5, 1.2}, "succeeded")
	w.tick()
	if r := w.record(trial(1)); r.Phase != runs.Succeeded {
		t.Fatalf("trial 1 %s (%s)", r.Phase, r.Message)
	}
	if r := w.record(trial(3)); r.Phase != runs.Submitted || r.Cluster != "sweep-a" {
		t.Fatalf("trial 3 %s on %s", r.Phase, r.Cluster)
	}
	if n := w.clusterWorkers("sweep-a"); n == 0 {
		t.Error("sweep-a went to zero between trials")
	}

	// Trial 2's first held-out loss trails trial 1's: stopped early.
	w.setJob(trial(2), 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLosses(trial(2), 1, []float64{2.6}, "")
	w.tick()
	r2 := w.record(trial(2))
	if r2.Phase != runs.Stopped || r2.Reason != runs.EarlyStopped || !strings.Contains(r2.Message, "median") {
		t.Fatalf("trial 2 %s (%s: %s), want STOPPED (EarlyStopped)", r2.Phase, r2.Reason, r2.Message)
	}
	if r2.Result == nil || len(r2.Result.Checkpoints) != 1 {
		t.Errorf("trial 2's checkpoints were not kept: %+v", r2.Result)
	}
	if _, err := w.ray.RayV1().RayJobs("default").Get(w.ctx, names.RayJob(trial(2), 1), metav1.GetOptions{}); err == nil {
		t.Error("the stopped trial's RayJob is still there")
	}
	if r := w.record(trial(4)); r.Phase != runs.Submitted || r.Cluster != "sweep-b" {
		t.Fatalf("trial 4 %s on %s", r.Phase, r.Cluster)
	}

	// Trials 3 and 4 end; the best is trial 4.
	w.setJob(trial(3), 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.setJob(trial(4), 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLosses(trial(3), 1, []float64{1.9, 1.4, 1.3}, "succeeded")
	w.writeLosses(trial(4), 1, []float64{1.8, 1.3, 1.0}, "succeeded")
	w.tick()
	w.tick()

	sw = w.sweep(id)
	if sw.Phase != sweeps.Succeeded || sw.Best != 4 || !sw.Published {
		t.Fatalf("sweep %s (best %d, published %v): %s", sw.Phase, sw.Best, sw.Published, sw.Message)
	}
	var outcomes []runs.Phase
	for _, tr := range sw.Trials {
		outcomes = append(outcomes, tr.Ended)
	}
	if !slices.Equal(outcomes, []runs.Phase{runs.Succeeded, runs.Stopped, runs.Succeeded, runs.Succeeded}) {
		t.Errorf("trials ended %v", outcomes)
	}
	var ends []map[string]any
	for _, ev := range w.events {
		if strings.HasPrefix(ev.Type(), "dev.raydrop.sweep.v1.") {
			var d map[string]any
			_ = json.Unmarshal(ev.Data(), &d)
			ends = append(ends, d)
			if ev.Type() != "dev.raydrop.sweep.v1.succeeded" {
				t.Errorf("sweep event %s", ev.Type())
			}
		}
	}
	if len(ends) != 1 {
		t.Fatalf("%d sweep events, want 1", len(ends))
	}
	best, _ := ends[0]["best"].(map[string]any)
	if best["runId"] != trial(4) || best["bestEvalLoss"] != 1.0 || ends[0]["stoppedEarly"] != 1.0 {
		t.Errorf("sweep event: best %v, stopped early %v", best, ends[0]["stoppedEarly"])
	}
	if w.count("stopped") != 1 || w.count("succeeded") != 3 {
		t.Errorf("trial events: stopped %d, succeeded %d", w.count("stopped"), w.count("succeeded"))
	}
	if _, err := w.gcs.Bucket(output).Object("raydrop/" + id + "/report.html").Attrs(w.ctx); err != nil || sw.Report == "" {
		t.Errorf("sweep report: %v (record: %q)", err, sw.Report)
	}
	for _, c := range []string{"sweep-a", "sweep-b"} {
		if n := w.clusterWorkers(c); n != 0 {
			t.Errorf("%s has %d workers after the sweep", c, n)
		}
	}
}

// TestSweepCancelled: a cancellation of a sweep stops every trial going,
// starts no other, and ends the sweep cancelled, once.
func TestSweepCancelled(t *testing.T) {
	w := newWorld(t)
	e := w.upload("jobs/lr.json", sweepSpec(t, []float64{1e-4, 2e-4, 4e-4}, nil))
	if err := w.deliver("intake", e); err != nil {
		t.Fatal(err)
	}
	w.drain()
	id := names.RunIDFromObject(intake, "jobs/lr.json", mustGen(t, e))
	w.setJob(sweeps.TrialRunID(id, 1), 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.cancel(id)
	w.tick()
	w.tick()
	sw := w.sweep(id)
	if sw.Phase != sweeps.Cancelled || !sw.Published {
		t.Fatalf("sweep %s (published %v): %s", sw.Phase, sw.Published, sw.Message)
	}
	for _, i := range []int{1, 2} {
		if r := w.record(sweeps.TrialRunID(id, i)); r.Phase != runs.Cancelled {
			t.Errorf("trial %d %s", i, r.Phase)
		}
	}
	if sw.Trials[2].Started() {
		t.Error("trial 3 started after the cancellation")
	}
	n := 0
	for _, ev := range w.events {
		if ev.Type() == "dev.raydrop.sweep.v1.cancelled" {
			n++
		}
	}
	if n != 1 || w.rayJobs() != 0 {
		t.Errorf("%d cancelled sweep events, %d RayJobs left", n, w.rayJobs())
	}
}
