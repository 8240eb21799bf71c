package kubesim

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The failures of a training run, each written where the real one writes
// it and shaped as it is, so that what reads them (the evidence, the
// cause, a person) meets the real thing. A rank's output reaches the
// driver prefixed by Ray with its actor's pid and node IP; here the IP is
// that of the worker pod holding the rank.

const (
	// CudaOOM: rank Rank runs out of GPU memory at step At (PyTorch's
	// caching allocator raises torch.OutOfMemoryError).
	CudaOOM Outcome = "cuda-oom"
	// NcclTimeout: an all-reduce at step At never completes on rank Rank;
	// its ProcessGroupNCCL watchdog times the collective out and takes the
	// process down. The watchdog's timeout is not waited here.
	NcclTimeout Outcome = "nccl-timeout"
	// OOMKilled: at step At the kernel's OOM killer kills the container of
	// the worker pod holding rank Rank (exit code 137, reason OOMKilled);
	// the kubelet restarts it, and the rank's actor is gone.
	OOMKilled Outcome = "oom-killed"
	// HostOOM: at step At Ray's memory monitor kills rank Rank's worker
	// process because its node runs low on memory.
	HostOOM Outcome = "host-oom"
	// ImagePull: the workers' image cannot be pulled; their pods wait in
	// ErrImagePull, then ImagePullBackOff, with the kubelet's events, and
	// the job never starts.
	ImagePull Outcome = "image-pull"
)

// Outcomes is every Outcome a scenario may name.
var Outcomes = []Outcome{Succeed, Fail, LoseHead, Hang, Preempt, Reclaim, ReclaimInSave, CudaOOM, NcclTimeout, OOMKilled, HostOOM, ImagePull}

// rankWorker is the worker pod that holds rank (the ranks are spread over
// the worker pods in name order, as many per pod as it has GPUs), and the
// prefix Ray gives that rank's lines on the driver.
func (t *trainer) rankWorker(ctx context.Context, rank int) (*corev1.Pod, string) {
	pods, _ := t.p.d.sim.clusterPods(ctx, t.ns, t.cluster, rayv1.WorkerNode)
	var live []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	ip := "10.244.0.2"
	var pod *corev1.Pod
	if len(live) > 0 {
		per := max(1, (t.a.numWorkers+len(live)-1)/len(live))
		pod = &live[min(rank/per, len(live)-1)]
		ip = pod.Status.PodIP
	}
	return pod, fmt.Sprintf("(RayTrainWorker pid=%d, ip=%s) ", 4242+rank, ip)
}

// failingRank is the scenario's rank, within the run's (default the last).
func (t *trainer) failingRank() int {
	if r := t.sc.Rank; r != nil && *r < t.a.numWorkers {
		return *r
	}
	return t.a.numWorkers - 1
}

// rankLines adds lines from a rank to the driver's output.
func (t *trainer) rankLines(prefix string, lines ...string) {
	for _, l := range lines {
		t.logf("%s%s", prefix, l)
	}
}

// traceback is the rank's Python traceback for an exception raised in
// the training step, as the worker prints it.
func traceback(exc string) []string {
	return []string{
		"Traceback (most recent call last):",
		`  File "/code/worker.py", line 412, in train_func`,
		"    trainer.train(resume_from_checkpoint=resume)",
		`  File "/usr/local/lib/python3.12/site-packages/transformers/trainer.py", line 2245, in train`,
		"    return inner_training_loop(",
		`  File "/usr/local/lib/python3.12/site-packages/torch/autograd/graph.py", line 825, in _engine_run_backward`,
		"    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
		exc,
	}
}

// cudaOOM is PyTorch's message when the caching allocator cannot get the
// memory (c10/cuda/CUDACachingAllocator.cpp, "CUDA out of memory. Tried to
// allocate …"; torch.OutOfMemoryError since PyTorch 2.4). A B200's
// capacity as PyTorch reports it.
func cudaOOM(rank int) string {
	return fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.50 GiB. GPU %d has a total capacity of 178.35 GiB of which 2.12 GiB is free. "+
		"Including non-PyTorch memory, this process has 176.21 GiB memory in use. Of the allocated memory 171.84 GiB is allocated by PyTorch, and 2.93 GiB is reserved by PyTorch but unallocated. "+
		"If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "+
		"See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)", rank%8)
}

// ncclWatchdog is what ProcessGroupNCCL's watchdog logs on the rank whose
// collective timed out, then the abort (torch/csrc/distributed/c10d/
// ProcessGroupNCCL.cpp, "Watchdog caught collective operation timeout",
// "To avoid data inconsistency, we are taking the entire process down.";
// the "[PG ID 0 PG GUID 0(default_pg) Rank N]" prefix since PyTorch 2.5).
// Ray Train's default process group timeout is 30 minutes.
func ncclWatchdog(rank, seq int, now time.Time) []string {
	glog := fmt.Sprintf("[rank%d]:[E%s ProcessGroupNCCL.cpp:%%d] [PG ID 0 PG GUID 0(default_pg) Rank %d] ", rank, now.UTC().Format("0102 15:04:05.000000000"), rank)
	return []string{
		fmt.Sprintf(glog, 632) + fmt.Sprintf("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%d, OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=1800000) ran for 1800087 milliseconds before timing out.", seq),
		fmt.Sprintf(glog, 2271) + fmt.Sprintf("Exception (either an error or timeout) detected by watchdog at work: %d, last enqueued NCCL work: %d, last completed NCCL work: %d.", seq, seq, seq-1),
		fmt.Sprintf(glog, 1664) + "Timeout at NCCL work: " + fmt.Sprint(seq) + ", last enqueued NCCL work: " + fmt.Sprint(seq) + ", last completed NCCL work: " + fmt.Sprint(seq-1) + ".",
		fmt.Sprintf(glog, 630) + "To avoid data inconsistency, we are taking the entire process down.",
		"terminate called after throwing an instance of 'c10::DistBackendError'",
	}
}

// actorDied is Ray's error for a Ray Train worker whose process died
// (python/ray/exceptions.py ActorDiedError, and the worker exit detail the
// raylet gives a process that vanished: "Worker unexpectedly exits with a
// connection error code 2. End of file. There are some potential root
// causes. (1) The process is killed by SIGKILL by OOM killer …").
func actorDied(pid int, ip string) string {
	return fmt.Sprintf("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"+
		"\tclass_name: RayTrainWorker\n\tactor_id: 8d1ef5f5c4a2b1e93f7b0c6a01000000\n\tpid: %d\n\tnamespace: 1b1d5e0e-4c57-4b35-9b6c-7a2f0d3e9c11\n\tip: %s\n"+
		"The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "+
		"There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. "+
		"(3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.", pid, ip)
}

// hostOOM is the error of a task Ray's memory monitor killed
// (src/ray/raylet/node_manager.cc, CreateOomKillMessageDetails, and
// python/ray/exceptions.py OutOfMemoryError; the threshold is
// RAY_memory_usage_threshold, 0.95 by default).
func hostOOM(pid int, ip string) string {
	return fmt.Sprintf("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"+
		"Memory on the node (IP: %s, ID: 3f6c2a9e0d5b4c1e8a7f9b2d6e4c0a1f3b5d7e9c2a4f6b8d0e1c3a5f) where the task (actor ID: 8d1ef5f5c4a2b1e93f7b0c6a01000000, name=RayTrainWorker.__init__, pid=%d, memory used=1712.40GB) was running was 1887.62GB / 1986.96GB (0.950004), "+
		"which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 5e2f8c1d9a7b3e6f0c4d2a8b1e9f7c3d5a6b0e2f4c8d1a3b) because it was the most recently scheduled task; "+
		"to see more information about memory usage on this node, use `ray logs raylet.out -ip %s`. To see the logs of the worker, use `ray logs worker-5e2f8c1d9a7b3e6f0c4d2a8b1e9f7c3d5a6b0e2f4c8d1a3b*out -ip %s. "+
		"Top 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n%d\t1712.40\tray::RayTrainWorker._RayTrainWorker__execute.get_next\n"+
		"Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html. "+
		"Consider provisioning more memory on this node or reducing task parallelism by requesting more CPUs per task. To adjust the kill threshold, set the environment variable `RAY_memory_usage_threshold` when starting Ray. "+
		"To disable worker killing, set the environment variable `RAY_memory_monitor_refresh_ms` to zero.", ip, pid, ip, ip, pid)
}

// rankFailure plays a failure raised on one rank at step: its lines on the
// driver, then the run fails as Ray Train fails it (the rank's error
// wrapped in Ray's, a failed mark).
func (t *trainer) rankFailure(ctx context.Context, step int) (rayv1.JobStatus, string) {
	rank := t.failingRank()
	pod, prefix := t.rankWorker(ctx, rank)
	ip := "10.244.0.2"
	if pod != nil {
		ip = pod.Status.PodIP
	}
	var errText string
	switch t.sc.Outcome {
	case CudaOOM:
		oom := cudaOOM(rank)
		t.rankLines(prefix, traceback(oom)...)
		t.rankOut(ctx, rank, "err", traceback(oom)...)
		errText = oom
	case NcclTimeout:
		lines := ncclWatchdog(rank, 40*step+7, time.Now())
		t.rankLines(prefix, lines...)
		t.rankOut(ctx, rank, "err", lines...)
		errText = "WorkerGroupError: Training failed due to worker errors: " + actorDied(4242+rank, ip)
	case HostOOM:
		t.p.d.sim.rayLogs.write(pod, "raylet.out", memoryMonitorKill(rank, ip, time.Now()))
		errText = hostOOM(4242+rank, ip)
	case OOMKilled:
		if pod != nil {
			if err := t.p.d.sim.RestartContainer(ctx, pod.Namespace, pod.Name, pod.Spec.Containers[0].Name, 137, "OOMKilled"); err != nil && ctx.Err() == nil {
				t.p.log().Warn("oom-killed: restart the worker's container", "pod", pod.Name, "err", err)
			}
			t.p.d.sim.event(ctx, pod, "kubelet", corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", pod.Spec.Containers[0].Name, pod.Name, pod.Namespace, pod.UID)
		}
		errText = "WorkerGroupError: Training failed due to worker errors: " + actorDied(4242+rank, ip)
	}
	t.p.log().Info("rank failed", "outcome", t.sc.Outcome, "rank", rank, "step", step)
	return t.fail(ctx, errText, step)
}

// imagePull plays a worker pod whose image cannot be pulled, as the
// kubelet reports it (pkg/kubelet/images/image_manager.go: ErrImagePull,
// then ImagePullBackOff, with Failed and BackOff events; containerd's
// NotFound for a missing tag). It returns how long until the next look.
func (k *kubelet) imagePull(ctx context.Context, pod *corev1.Pod) (time.Duration, error) {
	reason := "ErrImagePull"
	for _, cs := range pod.Status.ContainerStatuses {
		switch w := cs.State.Waiting; {
		case w == nil:
		case w.Reason == "ImagePullBackOff":
			return 0, nil // nothing changes until the pod goes
		case w.Reason == "ErrImagePull":
			// The kubelet backs off after the failed pull: about a second
			// after the pod was bound, here.
			if wait := time.Until(scheduledTime(pod).Add(time.Second + 500*time.Millisecond)); wait > 0 {
				return wait, nil
			}
			reason = "ImagePullBackOff"
		}
	}
	pod.Status.Phase = corev1.PodPending
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		msg := fmt.Sprintf("rpc error: code = NotFound desc = failed to pull and unpack image %q: failed to resolve reference %q: %s: not found", c.Image, c.Image, c.Image)
		if reason == "ImagePullBackOff" {
			msg = fmt.Sprintf("Back-off pulling image %q", c.Image)
		}
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
		})
		if reason == "ErrImagePull" {
			k.sim.event(ctx, pod, "kubelet", corev1.EventTypeNormal, "Pulling", "Pulling image %q", c.Image)
			k.sim.event(ctx, pod, "kubelet", corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %s", c.Image, msg)
			k.sim.event(ctx, pod, "kubelet", corev1.EventTypeWarning, "Failed", "Error: ErrImagePull")
		} else {
			k.sim.event(ctx, pod, "kubelet", corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", c.Image)
			k.sim.event(ctx, pod, "kubelet", corev1.EventTypeWarning, "Failed", "Error: ImagePullBackOff")
		}
	}
	return time.Second, k.Status().Update(ctx, pod)
}

// scheduledTime is when the pod was bound (to the second, as the API
// server keeps it), or now.
func scheduledTime(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Now()
}

// event records one Event about pod, as its source would; best effort, as
// the kubelet's own events are.
func (s *Sim) event(ctx context.Context, pod *corev1.Pod, source, typ, reason, format string, args ...any) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: pod.Name + "."},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         reason, Message: fmt.Sprintf(format, args...), Type: typ,
		Source: corev1.EventSource{Component: source}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if source == "kubelet" && pod.Spec.NodeName != "" {
		ev.Source.Host = pod.Spec.NodeName
	}
	_ = s.Client.Create(ctx, ev)
}

// knownOutcome reports whether o is an Outcome, and the allowed names.
func knownOutcome(o Outcome) (bool, string) {
	names := make([]string, len(Outcomes))
	for i, k := range Outcomes {
		names[i] = string(k)
		if k == o {
			return true, ""
		}
	}
	return false, strings.Join(names, ", ")
}
