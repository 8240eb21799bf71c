package kubesim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubelet plays the scheduler and each node's kubelet. A new Pod is bound
// to a node (nodes.go), then marked Running and Ready, with an IP and a
// container ID per container, as if its containers had started; their
// output goes to the container runtime's log files (containerlogs.go),
// which the kubelet's HTTPS endpoint serves (kubeletserver.go). A bound pod
// that is deleted stays Terminating until its kubelet has stopped its
// containers and deleted it with grace 0, as a kubelet does
// (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination);
// no preStop hook runs here, and each container exits at once.
type kubelet struct {
	client.Client
	ipSeq atomic.Int32
	// sim, when set, plays capacity (capacity.go): a worker pod whose tier
	// its job's Scenario refuses stays Pending.
	sim       *Sim
	scenarios sync.Map // RayJob UID → Scenario
	nodes     *nodes
	logs      *containerLogs
}

func (k *kubelet) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := k.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pod.DeletionTimestamp != nil {
		return ctrl.Result{}, k.terminate(ctx, pod)
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return ctrl.Result{}, nil
	}
	if pod.Spec.NodeName == "" {
		if tier := k.refusal(ctx, pod); tier != "" {
			return ctrl.Result{RequeueAfter: 250 * time.Millisecond}, k.unschedulable(ctx, pod, tier)
		}
		node, err := k.nodes.nodeFor(ctx, pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		// The bound pod comes back through the watch.
		return ctrl.Result{}, client.IgnoreNotFound(k.nodes.bind(ctx, pod, node))
	}
	if k.imageMissing(ctx, pod) {
		wait, err := k.imagePull(ctx, pod)
		return ctrl.Result{RequeueAfter: wait}, client.IgnoreNotFound(err)
	}
	now := metav1.Now()
	scheduled, pulling := k.pulling(ctx, pod, now)
	if pulling > 0 {
		return ctrl.Result{RequeueAfter: pulling}, client.IgnoreNotFound(k.Status().Update(ctx, pod))
	}
	n := k.ipSeq.Add(1)
	ip := fmt.Sprintf("10.244.%d.%d", n/250, n%250+2)
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	// Everything else the API server set stays (status.qosClass is computed
	// at creation and may not change).
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP = nodeIP
	pod.Status.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: scheduled}, cond(corev1.PodInitialized),
		cond(corev1.ContainersReady), cond(corev1.PodReady),
	}
	pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses = nil, nil
	var ids, sidecars []string
	for _, c := range pod.Spec.InitContainers {
		id, err := k.logs.start(pod, c.Name, 0)
		if err != nil {
			return ctrl.Result{}, err
		}
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, ContainerID: id}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			// A native sidecar: it runs beside the containers until they
			// have stopped.
			sidecars = append(sidecars, id)
			st.Started, st.State = ptr.To(true), corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		} else {
			k.logs.stop(id)
			st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: id}}
		}
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, st)
	}
	for _, c := range pod.Spec.Containers {
		id, err := k.logs.start(pod, c.Name, 0)
		if err != nil {
			return ctrl.Result{}, err
		}
		ids = append(ids, id)
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true), ContainerID: id,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	// What `ray start` prints is in the log before the pod is seen running,
	// as a real container's first lines are by the time its readiness
	// probe passes.
	if isRayNode(pod) && len(ids) > 0 {
		if err := k.logs.write(ids[0], "stderr", rayStartOutput(pod, ip, now.Time)); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := k.Status().Update(ctx, pod); err != nil {
		for _, id := range append(ids, sidecars...) {
			k.logs.stop(id) // never ran: the next try starts others
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if isRayNode(pod) && k.sim != nil {
		k.sim.rayLogs.write(pod, "raylet.out", rayletStart(pod, ip, now.Time))
		if pod.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.HeadNode) {
			k.sim.rayLogs.write(pod, "gcs_server.out", gcsStart(now.Time))
		}
	}
	k.started(ctx, pod, scheduled, now)
	return ctrl.Result{}, nil
}

// imageMissing reports whether a worker pod's image cannot be pulled: its
// job's scenario is image-pull.
func (k *kubelet) imageMissing(ctx context.Context, pod *corev1.Pod) bool {
	if pod.Labels[utils.RayNodeTypeLabelKey] != string(rayv1.WorkerNode) || k.sim == nil {
		return false
	}
	job := k.activeJob(ctx, pod)
	return job != nil && k.scenario(ctx, job).Outcome == ImagePull
}

// nodeIP is every simulated node's InternalIP: where the API server finds
// its kubelet.
const nodeIP = "127.0.0.1"

// terminate ends a deleted pod as its kubelet does: a pod on no node is
// already gone (the API server deletes it at once); one on a node has its
// containers stopped (exit code 143: ended by SIGTERM, the signal the
// kubelet sends), then its native sidecars (the raylogs sidecar makes its
// last copy on SIGTERM and exits 0), its status updated, then is deleted
// with grace 0.
func (k *kubelet) terminate(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.NodeName == "" {
		return nil
	}
	now := metav1.Now()
	changed := false
	if k.sim != nil {
		if err := k.sim.collectRayLogs(ctx, pod); err != nil && ctx.Err() == nil {
			k.sim.log.Warn("kubesim: the Ray log sidecar's last copy", "pod", pod.Name, "err", err)
		}
		k.sim.rayLogs.forget(pod)
	}
	stop := func(statuses []corev1.ContainerStatus, exitCode int32, reason string) {
		for i := range statuses {
			cs := &statuses[i]
			if cs.State.Running == nil {
				continue
			}
			k.logs.stop(cs.ContainerID)
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: reason, StartedAt: cs.State.Running.StartedAt, FinishedAt: now, ContainerID: cs.ContainerID,
			}}
			cs.Ready, cs.Started = false, ptr.To(false)
			changed = true
		}
	}
	stop(pod.Status.ContainerStatuses, 143, "Error")
	stop(pod.Status.InitContainerStatuses, 0, "Completed")
	if changed {
		if err := k.Status().Update(ctx, pod); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	err := k.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone already, or a pod of the same name that is not this one
	}
	return err
}

// started records what the scheduler and the kubelet record of a pod that
// came up (kubectl describe pod shows them): Scheduled, then per container
// Pulled (the pull's time, from the pod's binding), Created and Started.
// A pod with a pull also got Pulling when it was bound. Best effort, as
// the kubelet's own events are.
func (k *kubelet) started(ctx context.Context, pod *corev1.Pod, scheduled, now metav1.Time) {
	pull := now.Sub(scheduled.Time).Round(time.Millisecond)
	k.event(ctx, pod, "default-scheduler", "Scheduled", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, pod.Spec.NodeName)
	for _, c := range pod.Spec.Containers {
		k.event(ctx, pod, "kubelet", "Pulled", "Successfully pulled image %q in %s (%s including waiting). Image size: 0 bytes.", c.Image, pull, pull)
		k.event(ctx, pod, "kubelet", "Created", "Created container: %s", c.Name)
		k.event(ctx, pod, "kubelet", "Started", "Started container %s", c.Name)
	}
}

// event records one Normal Event about pod, as its source would.
func (k *kubelet) event(ctx context.Context, pod *corev1.Pod, source, reason, format string, args ...any) {
	k.sim.event(ctx, pod, source, corev1.EventTypeNormal, reason, format, args...)
}

// pulling plays the time a worker pod takes from its node to its running
// containers (its job's Scenario.Pull): the first time it sees the pod
// bound, it puts its containers in ContainerCreating and says how long to
// wait; it returns 0 once the pull is over, or for a pod with none.
// scheduled is when the pod was bound (to the second, as the API server
// keeps it).
func (k *kubelet) pulling(ctx context.Context, pod *corev1.Pod, now metav1.Time) (scheduled metav1.Time, wait time.Duration) {
	scheduled = now
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			scheduled = c.LastTransitionTime
		}
	}
	pull := time.Duration(0)
	if pod.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.WorkerNode) && k.sim != nil {
		if job := k.activeJob(ctx, pod); job != nil {
			pull = k.scenario(ctx, job).Pull
		}
	}
	if pull > 0 && len(pod.Status.ContainerStatuses) == 0 {
		pod.Status.Phase = corev1.PodPending
		for _, c := range pod.Spec.Containers {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
			})
			k.event(ctx, pod, "kubelet", "Pulling", "Pulling image %q", c.Image)
		}
		return scheduled, pull
	}
	end := scheduled.Add(pull)
	if pull == 0 || !now.Time.Before(end) {
		return scheduled, 0
	}
	return scheduled, end.Sub(now.Time)
}

// ContainerOutput appends text to what the running container of a pod has
// written to stream ("stdout" or "stderr"), as its process writes it.
func (s *Sim) ContainerOutput(ctx context.Context, ns, pod, container, stream, text string) error {
	p := &corev1.Pod{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, p); err != nil {
		return err
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Running != nil {
			return s.logs.write(cs.ContainerID, stream, text)
		}
	}
	return fmt.Errorf("kubesim: pod %s/%s has no running container %q", ns, pod, container)
}

// RestartContainer plays a container that exited with exitCode (reason
// "Error", or "OOMKilled" for one the kernel killed) and that its kubelet
// started again, as restartPolicy Always does: the pod's status keeps the
// exited instance in lastState.terminated (its log is what previous=true
// reads), counts the restart and names the new instance, whose log starts
// empty.
func (s *Sim) RestartContainer(ctx context.Context, ns, pod, container string, exitCode int32, reason string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := s.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, p); err != nil {
			return err
		}
		for i := range p.Status.ContainerStatuses {
			cs := &p.Status.ContainerStatuses[i]
			if cs.Name != container || cs.State.Running == nil {
				continue
			}
			id, err := s.logs.start(p, container, cs.RestartCount+1)
			if err != nil {
				return err
			}
			now := metav1.Now()
			s.logs.stop(cs.ContainerID)
			cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: reason, StartedAt: cs.State.Running.StartedAt, FinishedAt: now, ContainerID: cs.ContainerID,
			}}
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
			cs.ContainerID = id
			cs.RestartCount++
			if isRayNode(p) {
				s.rayLogs.write(p, "raylet.out", rayletStart(p, p.Status.PodIP, now.Time))
			}
			if err := s.Client.Status().Update(ctx, p); err != nil {
				s.logs.stop(id)
				return err
			}
			return nil
		}
		return fmt.Errorf("kubesim: pod %s/%s has no running container %q", ns, pod, container)
	})
}
