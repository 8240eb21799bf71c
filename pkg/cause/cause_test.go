package cause

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pods are a head and two worker pods, as pods.json keeps them.
func pods(mod func(w *corev1.ContainerStatus)) []evidence.PodRecord {
	worker := func(name, ip string) evidence.PodRecord {
		p := evidence.PodRecord{Name: name, Node: "gke-a4-" + name, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "ray-worker", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
		return p
	}
	out := []evidence.PodRecord{
		{Name: "c-head-x1", Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5",
			ContainerStatuses: []corev1.ContainerStatus{{Name: "ray-head", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}},
		worker("c-gpu-group-worker-aaaaa", "10.244.1.2"),
		worker("c-gpu-group-worker-bbbbb", "10.244.2.7"),
	}
	if mod != nil {
		mod(&out[2].Status.ContainerStatuses[0])
	}
	return out
}

func TestClassify(t *testing.T) {
	driver := func(name string) []Log {
		return []Log{{Source: "logs/r-1-abcde/ray-job-submitter.log.gz", Text: read(t, name)}}
	}
	for _, tc := range []struct {
		name    string
		in      Input
		want    Kind
		rank    int
		pod     string
		line    string // in the cause's lines
		summary string // in its summary
	}{
		{name: "cuda oom on the rank that raised first", want: CudaOutOfMemory, pod: "c-gpu-group-worker-aaaaa", rank: -1,
			in:   Input{Reason: runs.ApplicationError, Step: 12, Pods: pods(nil), Logs: driver("cuda-oom.driver.log")},
			line: "Tried to allocate 4.50 GiB", summary: "CUDA out of memory after step 12 (pod c-gpu-group-worker-aaaaa)"},
		{name: "nccl watchdog in the rank's own file", want: NcclTimeout, rank: 9, pod: "c-gpu-group-worker-bbbbb",
			in: Input{Reason: runs.InfrastructureFailure, Pods: pods(nil), Logs: []Log{
				{Source: "logs/r-1-abcde/ray-job-submitter.log.gz", Text: "2026-12-07 10:02:11,412\tINFO worker.py:1927 -- Connected to Ray cluster.\n"},
				{Source: "ray/c-gpu-group-worker-bbbbb/worker-ab-02000000-4251.err", Pod: "c-gpu-group-worker-bbbbb", Text: read(t, "nccl-timeout.rank.err")},
			}},
			line: "Timeout(ms)=1800000", summary: "an NCCL collective timed out on rank 9"},
		{name: "the memory monitor", want: HostOutOfMemory, rank: -1,
			in:   Input{Reason: runs.ApplicationError, Pods: pods(nil), Logs: driver("host-oom.driver.log")},
			line: "which exceeds the memory usage threshold of 0.95", summary: "node ran low on memory"},
		{name: "the memory monitor in raylet.out", want: HostOutOfMemory, rank: -1, pod: "c-gpu-group-worker-bbbbb",
			in: Input{Reason: runs.ApplicationError, Logs: []Log{{Source: "ray/c-gpu-group-worker-bbbbb/raylet.out", Pod: "c-gpu-group-worker-bbbbb",
				Text: "[2026-12-07 10:03:01,001 E 184 184] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 3f6c, IP: 10.244.2.7) over the last time period.\n"}}},
			line: "killed due to memory pressure (OOM)"},
		{name: "nccl error", want: NcclError, rank: 4, pod: "c-gpu-group-worker-aaaaa",
			in:   Input{Reason: runs.ApplicationError, Pods: pods(nil), Logs: driver("nccl-error.driver.log")},
			line: "ncclSystemError", summary: "NCCL failed on rank 4"},
		{name: "gpu ecc error", want: GpuError, rank: -1, pod: "c-gpu-group-worker-bbbbb",
			in:   Input{Reason: runs.ApplicationError, Pods: pods(nil), Logs: driver("gpu-error.driver.log")},
			line: "uncorrectable ECC error", summary: "a GPU error (pod c-gpu-group-worker-bbbbb): RuntimeError: CUDA error: uncorrectable ECC error encountered"},
		{name: "a data error raised in training", want: DataError, rank: -1, pod: "c-gpu-group-worker-aaaaa",
			in:   Input{Reason: runs.ApplicationError, Pods: pods(nil), Logs: driver("data.driver.log")},
			line: "metadata.jsonl line 17: not JSON", summary: "the data cannot be trained on"},
		{name: "the data check refused the data", want: DataError, rank: -1,
			in:   Input{Reason: runs.InvalidData, Message: "gs://data/products/train/metadata.jsonl line 3: image 'a.png' cannot be decoded"},
			line: "cannot be decoded"},
		{name: "any other exception, with its last frames", want: PythonException, rank: -1, pod: "c-gpu-group-worker-aaaaa",
			in:   Input{Reason: runs.ApplicationError, Step: 3, Pods: pods(nil), Logs: driver("python.driver.log")},
			line: `File "/code/sft.py", line 88, in collate`, summary: "the training code raised IndexError after step 3 (pod c-gpu-group-worker-aaaaa): index 1024 is out of bounds"},
		{name: "an exception only the mark names", want: PythonException, rank: -1,
			in:   Input{Reason: runs.ApplicationError, Mark: &Mark{Status: "failed", Error: "ValueError: too many long rows"}},
			line: "ValueError: too many long rows", summary: "raised ValueError: too many long rows"},
		{name: "a cuda oom only the mark names", want: CudaOutOfMemory, rank: -1,
			in:   Input{Reason: runs.ApplicationError, Mark: &Mark{Status: "failed", Error: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."}},
			line: "Tried to allocate 2.00 GiB"},
		{name: "the OOM killer, not the ActorDiedError it leaves", want: OOMKilled, rank: -1, pod: "c-gpu-group-worker-bbbbb",
			in: Input{Reason: runs.ApplicationError, Pods: pods(func(w *corev1.ContainerStatus) {
				w.RestartCount = 1
				w.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
			}), Logs: []Log{{Text: "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. (1) The process is killed by SIGKILL by OOM killer due to high memory usage."}}},
			line: "exit code 137, reason OOMKilled", summary: "killed at its memory limit"},
		{name: "exit 137 alone is a SIGKILL, not an OOM", want: Unknown, rank: -1,
			in: Input{Reason: runs.InfrastructureFailure, Message: "the RayJob ended without the trainer's completion mark", Pods: pods(func(w *corev1.ContainerStatus) {
				w.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}
			})},
			summary: "no known cause: the RayJob ended without the trainer's completion mark"},
		{name: "an image that cannot be pulled", want: ImagePull, rank: -1, pod: "c-gpu-group-worker-bbbbb",
			in: Input{Reason: runs.StartDeadlineExceeded, Pods: pods(func(w *corev1.ContainerStatus) {
				w.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "us-docker.pkg.dev/p/r/trainer:nope"`}}
			}), Events: []corev1.Event{{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "c-gpu-group-worker-bbbbb"}, Reason: "Failed",
				Message: `Failed to pull image "us-docker.pkg.dev/p/r/trainer:nope": rpc error: code = NotFound desc = failed to pull and unpack image: not found`}}},
			line: "code = NotFound", summary: "an image cannot be pulled (pod c-gpu-group-worker-bbbbb)"},
		{name: "a pull failure only the events show", want: ImagePull, rank: -1, pod: "c-gpu-group-worker-ccccc",
			in: Input{Reason: runs.StartDeadlineExceeded, Events: []corev1.Event{{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "c-gpu-group-worker-ccccc"}, Reason: "Failed",
				Message: `Failed to pull image "x:1": rpc error: code = NotFound`}}},
			line: `Failed to pull image "x:1"`},
		{name: "preempted", want: Preempted, rank: -1, in: Input{Reason: runs.Preempted}, summary: "limits.preemptions"},
		{name: "the trainer's preempted mark", want: Preempted, rank: -1, in: Input{Reason: runs.InfrastructureFailure, Mark: &Mark{Status: "preempted"}}},
		{name: "a stall", want: Stalled, rank: -1, in: Input{Reason: runs.Reason("Stalled"), Step: 40}, summary: "after step 40"},
		{name: "the deadline", want: DeadlineExceeded, rank: -1, in: Input{Reason: runs.DeadlineExceeded, Step: 7, Logs: []Log{{Text: "(RayTrainWorker pid=1, ip=10.244.1.2) {'loss': 1.2}\n"}}},
			summary: "longer than limits.deadline after step 7"},
		{name: "the start deadline", want: DeadlineExceeded, rank: -1, in: Input{Reason: runs.StartDeadlineExceeded}, summary: "did not start within limits.startDeadline"},
		{name: "cancelled, whatever the logs show", want: Cancelled, rank: -1, in: Input{Reason: runs.ReasonCancelled, Logs: driver("cuda-oom.driver.log")}},
		{name: "nothing to go on", want: Unknown, rank: -1, in: Input{Reason: runs.InfrastructureFailure}, summary: "no known cause"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Classify(tc.in)
			if Kind(c.Kind) != tc.want || c.Rank != tc.rank || c.Pod != tc.pod {
				t.Fatalf("cause %s rank %d pod %q; want %s rank %d pod %q\n%+v", c.Kind, c.Rank, c.Pod, tc.want, tc.rank, tc.pod, c)
			}
			if tc.line != "" && !strings.Contains(strings.Join(c.Lines, "\n"), tc.line) {
				t.Errorf("lines %q, want one with %q", c.Lines, tc.line)
			}
			if !strings.Contains(c.Summary, tc.summary) || c.Summary == "" {
				t.Errorf("summary %q, want it to hold %q", c.Summary, tc.summary)
			}
			if Kind(c.Kind) != Cancelled && c.Hint == "" {
				t.Errorf("%s has no hint", c.Kind)
			}
		})
	}
}

// TestEveryKindHasAHint: each cause but Cancelled says what to change.
func TestEveryKindHasAHint(t *testing.T) {
	for _, k := range Kinds {
		if _, ok := hints[k]; !ok {
			t.Errorf("%s: no entry in hints", k)
		}
	}
	if len(hints) != len(Kinds) {
		t.Errorf("%d hints for %d kinds", len(hints), len(Kinds))
	}
}
