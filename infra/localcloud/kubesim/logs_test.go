package kubesim_test

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestPodLogs reads containers' output the way production reads it: client-go
// GetLogs against the real kube-apiserver, which proxies over HTTPS to the
// kubelet of the pod's node. Worker pods are bound to GPU nodes made for
// them; a container still pulling its image gets the kubelet's 400,
// relayed; tailLines, limitBytes, timestamps, previous and follow are
// honoured; a deleted pod's node goes with it.
func TestPodLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs := clientset(t)
	sc := kubesim.DefaultScenario()
	sc.Pull = 3 * time.Second
	s, rj := startJob(t, "sim-logs", sc)

	// While a worker's image is pulled, its container waits: the kubelet
	// answers 400 and the API server relays it.
	var waitErr error
	waitFor(t, "a worker pod bound and pulling", 30*time.Second, func() (bool, error) {
		for _, p := range listPods(t, "sim-logs", "worker") {
			if p.Spec.NodeName == "" || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
				continue
			}
			_, waitErr = cs.CoreV1().Pods("default").GetLogs(p.Name, &corev1.PodLogOptions{}).Stream(ctx)
			return true, nil
		}
		return false, nil
	})
	if !apierrors.IsBadRequest(waitErr) || !strings.Contains(waitErr.Error(), "is waiting to start: ContainerCreating") {
		t.Errorf("logs of a container pulling its image: %v, want the kubelet's 400 \"is waiting to start: ContainerCreating\"", waitErr)
	}

	var pod corev1.Pod
	waitFor(t, "worker pods running", 30*time.Second, func() (bool, error) {
		pods := listPods(t, "sim-logs", "worker")
		for _, p := range pods {
			if p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		if len(pods) > 0 {
			pod = pods[0]
		}
		return len(pods) == 2, nil
	})

	// The pod's node: made for it, with its node selector's labels and
	// GKE's, reached at 127.0.0.1.
	node, err := cs.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metaGet)
	if err != nil {
		t.Fatalf("pod %s's node %q: %v", pod.Name, pod.Spec.NodeName, err)
	}
	for k, v := range pod.Spec.NodeSelector {
		if node.Labels[k] != v {
			t.Errorf("node %s: label %s=%q, the pod asks for %q", node.Name, k, node.Labels[k], v)
		}
	}
	for _, k := range []string{"cloud.google.com/gke-nodepool", "cloud.google.com/gke-provisioning", corev1.LabelInstanceTypeStable, corev1.LabelTopologyZone} {
		if node.Labels[k] == "" {
			t.Errorf("node %s has no %s label: %v", node.Name, k, node.Labels)
		}
	}
	if got := node.Status.Allocatable["nvidia.com/gpu"]; got.Value() < int64(s.Cluster.Workers.GPUs) {
		t.Errorf("node %s: %v allocatable GPUs, the pod asks for %d", node.Name, got.String(), s.Cluster.Workers.GPUs)
	}
	if node.Labels[names.NodeAccelerator] != s.Cluster.Workers.Accelerator {
		t.Errorf("node %s: accelerator %q, want %q", node.Name, node.Labels[names.NodeAccelerator], s.Cluster.Workers.Accelerator)
	}
	if pod.Status.HostIP != "127.0.0.1" || len(pod.Status.ContainerStatuses) == 0 || !strings.HasPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://") {
		t.Errorf("pod %s: hostIP %q, containers %+v", pod.Name, pod.Status.HostIP, pod.Status.ContainerStatuses)
	}

	// What `ray start --block` printed.
	if got := podLog(t, cs, pod.Name, ""); !strings.Contains(got, "Ray runtime started.") || !strings.Contains(got, "Local node IP: "+pod.Status.PodIP) {
		t.Errorf("worker %s's log does not show ray start: %q", pod.Name, got)
	}
	heads := listPods(t, "sim-logs", "head")
	if len(heads) != 1 {
		t.Fatalf("%d head pods", len(heads))
	}
	if got := podLog(t, cs, heads[0].Name, ""); !strings.Contains(got, "ray start --address='"+heads[0].Status.PodIP+":6379'") || !strings.Contains(got, "This command will now block forever") {
		t.Errorf("head %s's log does not show ray start --head: %q", heads[0].Name, got)
	}
	// The submitter pod's log: the submission, the driver's output, the end.
	rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusComplete, 60*time.Second)
	sub := submitterPod(t, rj.Name)
	id := "raydrop-sim-logs-0001-1"
	log := podLog(t, cs, sub.Name, "")
	for _, want := range []string{"Job '" + id + "' submitted successfully", "Tailing logs until the job exits", "raydrop: run sim-logs-0001", "Job '" + id + "' succeeded"} {
		if !strings.Contains(log, want) {
			t.Errorf("submitter %s's log has no %q:\n%s", sub.Name, want, log)
		}
	}
	if sub.Status.Phase != corev1.PodSucceeded || sub.Status.ContainerStatuses[0].State.Terminated == nil || sub.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0 {
		t.Errorf("submitter %s: phase %s, containers %+v; want Succeeded, exit 0", sub.Name, sub.Status.Phase, sub.Status.ContainerStatuses)
	}

	container := pod.Spec.Containers[0].Name
	logs := func(o corev1.PodLogOptions) string {
		t.Helper()
		o.Container = container
		b, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &o).DoRaw(ctx)
		if err != nil {
			t.Fatalf("GetLogs %+v: %v", o, err)
		}
		return string(b)
	}
	var lines []string
	for i := 1; i <= 5; i++ {
		lines = append(lines, fmt.Sprintf("step %d of 5", i))
	}
	if err := sim.ContainerOutput(ctx, "default", pod.Name, container, "stdout", strings.Join(lines, "\n")+"\n"); err != nil {
		t.Fatal(err)
	}
	if err := sim.ContainerOutput(ctx, "default", pod.Name, container, "stderr", "a warning"); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(lines, "\n") + "\na warning\n"
	if got := logs(corev1.PodLogOptions{}); !strings.HasSuffix(got, "--block\n"+all) && !strings.Contains(got, "\n"+all) {
		t.Errorf("whole log %q, want %q", got, all)
	}
	if got, want := logs(corev1.PodLogOptions{TailLines: ptr.To[int64](2)}), "step 5 of 5\na warning\n"; got != want {
		t.Errorf("tailLines=2: %q, want %q", got, want)
	}
	if got, want := logs(corev1.PodLogOptions{LimitBytes: ptr.To[int64](10)}), podLog(t, cs, pod.Name, "")[:10]; got != want {
		t.Errorf("limitBytes=10: %q, want %q", got, want)
	}
	for _, l := range strings.Split(strings.TrimSpace(logs(corev1.PodLogOptions{Timestamps: true})), "\n") {
		ts, _, _ := strings.Cut(l, " ")
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("timestamps=true: line %q does not start with a time: %v", l, err)
		}
	}
	if _, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, Previous: true}).Stream(ctx); !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "previous terminated container") {
		t.Errorf("previous of a container that never restarted: %v, want the kubelet's 400", err)
	}

	// A follow streams what comes while it reads.
	stream, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, Follow: true, TailLines: ptr.To[int64](0)}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	followed := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stream).ReadString('\n')
		followed <- l
	}()
	time.Sleep(200 * time.Millisecond)
	if err := sim.ContainerOutput(ctx, "default", pod.Name, container, "stdout", "followed"); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-followed:
		if l != "followed\n" {
			t.Errorf("follow read %q, want %q", l, "followed\n")
		}
	case <-time.After(10 * time.Second):
		t.Error("follow: nothing within 10s of the write")
	}
	_ = stream.Close()

	// A restart keeps the exited instance's log for previous=true.
	if err := sim.RestartContainer(ctx, "default", pod.Name, container, 137, "OOMKilled"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart in the pod's status", 10*time.Second, func() (bool, error) {
		cur, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metaGet)
		if err != nil {
			return false, err
		}
		st := cur.Status.ContainerStatuses[0]
		last := st.LastTerminationState.Terminated
		return st.RestartCount == 1 && last != nil && last.Reason == "OOMKilled" && last.ExitCode == 137 && last.ContainerID == pod.Status.ContainerStatuses[0].ContainerID, nil
	})
	waitFor(t, "the restarted container's output", 10*time.Second, func() (bool, error) {
		return sim.ContainerOutput(ctx, "default", pod.Name, container, "stdout", "after the restart") == nil, nil
	})
	if got := logs(corev1.PodLogOptions{}); got != "after the restart\n" {
		t.Errorf("log after the restart %q, want only what the new instance wrote", got)
	}
	if got := logs(corev1.PodLogOptions{Previous: true}); !strings.HasSuffix(got, all+"followed\n") || !strings.Contains(got, "Ray runtime started.") {
		t.Errorf("previous=true: %q, want ray start's lines then %q", got, all+"followed\n")
	}

	// A bound pod, deleted, is ended by its kubelet: it goes, and so does
	// the node made for it.
	if err := cs.CoreV1().Pods("default").Delete(ctx, pod.Name, metaDelete); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod and its node gone", 20*time.Second, func() (bool, error) {
		_, perr := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metaGet)
		_, nerr := cs.CoreV1().Nodes().Get(ctx, node.Name, metaGet)
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(nerr), fmt.Errorf("pod: %w, node: %w", perr, nerr)
	})
}

// TestSubmitterLogOfAFailedJob: the submitter of a job that fails prints
// Ray's error box and the status message, and exits 1.
func TestSubmitterLogOfAFailedJob(t *testing.T) {
	t.Parallel()
	cs := clientset(t)
	_, rj := startJob(t, "sim-sublog", kubesim.Scenario{Outcome: kubesim.Fail, At: 2})
	rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusFailed, 60*time.Second)
	var sub corev1.Pod
	waitFor(t, "the submitter pod ended", 20*time.Second, func() (bool, error) {
		sub = submitterPod(t, rj.Name)
		return sub.Status.Phase == corev1.PodFailed, nil
	})
	id := "raydrop-sim-sublog-0001-1"
	log := podLog(t, cs, sub.Name, "")
	for _, want := range []string{"Job '" + id + "' submitted successfully", "RuntimeError: simulated training failure at step 2", "ERR cli.py:72 -- Job '" + id + "' failed", "Status message: Job entrypoint command failed with exit code 1"} {
		if !strings.Contains(log, want) {
			t.Errorf("submitter %s's log has no %q:\n%s", sub.Name, want, log)
		}
	}
	if term := sub.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 1 || term.Reason != "Error" {
		t.Errorf("submitter %s's container: %+v, want exit 1 (Error)", sub.Name, sub.Status.ContainerStatuses[0].State)
	}
}

// clientset reaches the simulator's API server as client-go does.
func clientset(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(sim.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// startJob creates the example's cluster named cluster and submits run
// <cluster>-0001's first attempt on it, played as sc.
func startJob(t *testing.T, cluster string, sc kubesim.Scenario) (*spec.JobSpec, *rayv1.RayJob) {
	t.Helper()
	s := exampleSpec(t, cluster)
	createCluster(t, s)
	return s, submit(t, s, manifests.Run{ID: cluster + "-0001", Attempt: 1, SpecHash: s.Hash()}, sc)
}

// submitterPod is the pod of the RayJob's submitter Job.
func submitterPod(t *testing.T, job string) corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.InNamespace("default"), client.MatchingLabels{"batch.kubernetes.io/job-name": job}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods of submitter Job %s, want 1", len(pods.Items), job)
	}
	return pods.Items[0]
}

// podLog is a pod's container's log through the API server (container ""
// for its only or first one).
func podLog(t *testing.T, cs kubernetes.Interface, pod, container string) string {
	t.Helper()
	b, err := cs.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("logs of %s: %v", pod, err)
	}
	return string(b)
}

var (
	metaGet    = metav1.GetOptions{}
	metaDelete = metav1.DeleteOptions{}
)
