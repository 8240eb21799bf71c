package cause

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/runs"
)

// TestDiagnose: from the bucket alone, the cause, each rank's first error
// lines, the pods' last states and the events that matter.
func TestDiagnose(t *testing.T) {
	driver := "2026-12-07 10:35:02,118\tERROR tune_controller.py:1331 -- Trial task failed for trial TorchTrainer_6b2d1_00000\n" +
		"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
	at := metav1.Date(2026, 12, 7, 10, 35, 0, 0, time.UTC)
	st := evidenceOf(t, driver, map[string][]byte{
		"ray/c-gpu-group-worker-bbbbb/worker-ab12-02000000-4251.err": []byte(read(t, "nccl-timeout.rank.err")),
		"ray/c-gpu-group-worker-aaaaa/worker-cd34-02000000-4242.err": []byte("2026-12-07 10:02:20,115\tINFO config.py:83 -- Setting up process group for: env://10.244.1.2:29500 [rank=0, world_size=16]\n" +
			"Traceback (most recent call last):\n  File \"/code/worker.py\", line 412, in train_func\n    trainer.train()\n" +
			"  File \"/usr/local/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py\", line 2806, in all_reduce\n    work = group.allreduce([tensor], opts)\n" +
			"torch.distributed.DistBackendError: [rank0] connection reset by peer\n"),
		"ray/c-gpu-group-worker-aaaaa/worker-cd34-02000000-4242.out": []byte("{'loss': 1.93}\n"),
		"events.json": js(t, []corev1.Event{
			{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "c-gpu-group-worker-bbbbb"}, Type: "Normal", Reason: "Created", LastTimestamp: at},
			{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "c-gpu-group-worker-bbbbb"}, Type: "Warning", Reason: "BackOff", Message: "Back-off restarting failed container", LastTimestamp: metav1.NewTime(at.Add(2e9))},
			{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "c-gpu-group-worker-aaaaa"}, Type: "Normal", Reason: "Killing", Message: "Stopping container ray-worker", LastTimestamp: metav1.NewTime(at.Add(1e9))},
		}),
	})
	rec := &runs.Record{RunID: "r", Phase: runs.Failed, Reason: runs.InfrastructureFailure, Message: "RayJob r-1 ended Failed/FAILED", Attempt: 1}
	d := Diagnose(context.Background(), st, "run/evidence/attempt-1", "gs://b/run/evidence/attempt-1/", rec, nil)
	if d.Unread != "" || Kind(d.Cause.Kind) != NcclTimeout || d.Cause.Rank != 9 || d.Evidence != "gs://b/run/evidence/attempt-1/" {
		t.Fatalf("%+v", d)
	}
	if len(d.Ranks) != 2 {
		t.Fatalf("ranks %+v, want the two with errors", d.Ranks)
	}
	byRank := map[int]RankErrors{}
	for _, r := range d.Ranks {
		byRank[r.Rank] = r
	}
	if r := byRank[9]; r.Pod != "c-gpu-group-worker-bbbbb" || !strings.Contains(r.Lines[0], "Watchdog caught collective operation timeout") {
		t.Errorf("rank 9: %+v", r)
	}
	if r := byRank[0]; r.Pod != "c-gpu-group-worker-aaaaa" || !strings.HasPrefix(r.Lines[0], "torch.distributed.DistBackendError: [rank0] connection reset") ||
		!strings.Contains(strings.Join(r.Lines, "\n"), "distributed_c10d.py\", line 2806, in all_reduce") {
		t.Errorf("rank 0: %+v", r)
	}
	if len(d.Pods) != 3 || d.Pods[2].Containers[0].State != "running" {
		t.Errorf("pods %+v", d.Pods)
	}
	if len(d.Events) != 2 || d.Events[0].Reason != "Killing" || d.Events[1].Reason != "BackOff" || d.Events[1].Object != "Pod/c-gpu-group-worker-bbbbb" {
		t.Errorf("events %+v, want Killing then BackOff, not Created", d.Events)
	}

	// A recorded cause is the one shown.
	rec.Cause = &Cause{Kind: string(Preempted), Summary: "recorded", Rank: -1}
	if d := Diagnose(context.Background(), st, "run/evidence/attempt-1", "", rec, nil); d.Cause.Summary != "recorded" {
		t.Errorf("cause %+v, want the recorded one", d.Cause)
	}
}
