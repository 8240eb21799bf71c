package cause

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

// folder writes an attempt's evidence folder as Capture and the raylogs
// sidecars write it: files by path, relative to it.
func folder(t *testing.T, files map[string][]byte) checkpoints.Store {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		p := filepath.Join(dir, "run", "evidence", "attempt-1", filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return checkpoints.Dir(dir)
}

func gz(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func js(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func evidenceOf(t *testing.T, driver string, extra map[string][]byte) checkpoints.Store {
	sub := "logs/r-1-x7k2p/ray-job-submitter.log.gz"
	m := evidence.Manifest{SchemaVersion: 1, RunID: "r", Attempt: 1, RayJob: "r-1", Files: []evidence.File{
		{Path: "pods.json", Kind: evidence.KindPods}, {Path: "events.json", Kind: evidence.KindEvents},
		{Path: sub, Kind: evidence.KindLog, Pod: "r-1-x7k2p", Container: "ray-job-submitter"},
		{Path: "logs/c-gpu-group-worker-bbbbb/ray-worker.log.gz", Kind: evidence.KindLog, Pod: "c-gpu-group-worker-bbbbb", Container: "ray-worker"},
	}}
	files := map[string][]byte{
		evidence.ManifestFile: js(t, m),
		"pods.json":           js(t, pods(nil)),
		"events.json":         js(t, []corev1.Event{{InvolvedObject: corev1.ObjectReference{Kind: "RayJob", Name: "r-1"}, Reason: "Created"}}),
		sub:                   gz(t, driver),
		"logs/c-gpu-group-worker-bbbbb/ray-worker.log.gz": gz(t, "Ray runtime started.\n"),
	}
	for k, v := range extra {
		files[k] = v
	}
	return folder(t, files)
}

// TestGatherReadsTheDriversOutput: a cause the driver's output shows is
// named from it, through the manifest's submitter log.
func TestGatherReadsTheDriversOutput(t *testing.T) {
	st := evidenceOf(t, read(t, "cuda-oom.driver.log"), nil)
	in := Input{Reason: runs.ApplicationError}
	if err := Gather(context.Background(), st, "run/evidence/attempt-1", &in); err != nil {
		t.Fatal(err)
	}
	if len(in.Pods) != 3 || len(in.Events) != 1 || len(in.Logs) != 1 {
		t.Fatalf("gathered %d pods, %d events, %d logs; want 3, 1 and the driver's", len(in.Pods), len(in.Events), len(in.Logs))
	}
	c := Classify(in)
	if Kind(c.Kind) != CudaOutOfMemory || c.Source != "logs/r-1-x7k2p/ray-job-submitter.log.gz" || c.Pod != "c-gpu-group-worker-aaaaa" {
		t.Errorf("%+v", c)
	}
}

// TestGatherFallsBackToTheRanksOwnLogs: when the driver's output shows
// only Ray's account of a dead actor, the rank's own stderr names the
// cause.
func TestGatherFallsBackToTheRanksOwnLogs(t *testing.T) {
	driver := "2026-12-07 10:35:02,118\tERROR tune_controller.py:1331 -- Trial task failed for trial TorchTrainer_6b2d1_00000\n" +
		"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
	st := evidenceOf(t, driver, map[string][]byte{
		"ray/c-gpu-group-worker-bbbbb/index.json":                    []byte(`{"files":{}}`),
		"ray/c-gpu-group-worker-bbbbb/raylet.out":                    []byte("[2026-12-07 10:02:01,001 I 184 184] (raylet) main.cc:227: Raylet started\n"),
		"ray/c-gpu-group-worker-bbbbb/worker-ab12-02000000-4251.err": []byte(read(t, "nccl-timeout.rank.err")),
		"ray/c-gpu-group-worker-aaaaa/worker-cd34-02000000-4242.out": []byte("{'loss': 1.93}\n"),
		"ray/c-gpu-group-worker-aaaaa/worker-ef56-ffffffff-4100.err": []byte(""),
	})
	in := Input{Reason: runs.InfrastructureFailure}
	if err := Gather(context.Background(), st, "run/evidence/attempt-1", &in); err != nil {
		t.Fatal(err)
	}
	c := Classify(in)
	if Kind(c.Kind) != NcclTimeout || c.Rank != 9 || c.Pod != "c-gpu-group-worker-bbbbb" || c.Source != "ray/c-gpu-group-worker-bbbbb/worker-ab12-02000000-4251.err" {
		t.Errorf("%+v", c)
	}
	if n := len(in.Logs); n != 5 {
		t.Errorf("%d logs gathered, want the driver's and 4 Ray logs (not index.json)", n)
	}
}

// TestGatherOfNothing: an evidence folder that was never written names
// no cause of its own, and is no error.
func TestGatherOfNothing(t *testing.T) {
	in := Input{Reason: runs.DeadlineExceeded}
	if err := Gather(context.Background(), checkpoints.Dir(t.TempDir()), "run/evidence/attempt-1", &in); err != nil {
		t.Fatal(err)
	}
	if c := Classify(in); Kind(c.Kind) != DeadlineExceeded {
		t.Errorf("%+v", c)
	}
}

// TestGatherOfAMalformedFile: a pods.json that is not JSON is reported,
// and the rest still read.
func TestGatherOfAMalformedFile(t *testing.T) {
	st := evidenceOf(t, read(t, "python.driver.log"), map[string][]byte{"pods.json": []byte("{not json")})
	in := Input{Reason: runs.ApplicationError}
	err := Gather(context.Background(), st, "run/evidence/attempt-1", &in)
	if err == nil || !errors.Is(err, checkpoints.ErrUnreadable) {
		t.Errorf("err %v, want pods.json unreadable", err)
	}
	if c := Classify(in); Kind(c.Kind) != PythonException || Exception(c) != "IndexError" {
		t.Errorf("%+v", c)
	}
}
