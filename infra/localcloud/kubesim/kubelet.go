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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubelet marks every new Pod Running and Ready, with an IP, as if it had
// been scheduled and its containers started. Pods never get a node name,
// so the API server deletes them at once.
type kubelet struct {
	client.Client
	ipSeq atomic.Int32
	// sim, when set, plays capacity (capacity.go): a worker pod whose tier
	// its job's Scenario refuses stays Pending.
	sim       *Sim
	scenarios sync.Map // RayJob UID → Scenario
}

func (k *kubelet) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := k.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return ctrl.Result{}, nil
	}
	if tier := k.refusal(ctx, pod); tier != "" {
		return ctrl.Result{RequeueAfter: 250 * time.Millisecond}, k.unschedulable(ctx, pod, tier)
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
	pod.Status.HostIP = "10.0.0.10"
	pod.Status.HostIPs = []corev1.HostIP{{IP: "10.0.0.10"}}
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: scheduled}, cond(corev1.PodInitialized),
		cond(corev1.ContainersReady), cond(corev1.PodReady),
	}
	pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses = nil, nil
	for _, c := range pod.Spec.InitContainers {
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		})
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if err := k.Status().Update(ctx, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	k.started(ctx, pod, scheduled, now)
	return ctrl.Result{}, nil
}

// started records what the scheduler and the kubelet record of a pod that
// came up (kubectl describe pod shows them): Scheduled, then per container
// Pulled (the pull's time, from the pod's binding), Created and Started.
// A pod with a pull also got Pulling when it was bound. Best effort, as
// the kubelet's own events are.
func (k *kubelet) started(ctx context.Context, pod *corev1.Pod, scheduled, now metav1.Time) {
	pull := now.Sub(scheduled.Time).Round(time.Millisecond)
	k.event(ctx, pod, "default-scheduler", "Scheduled", "Successfully assigned %s/%s to a simulated node", pod.Namespace, pod.Name)
	for _, c := range pod.Spec.Containers {
		k.event(ctx, pod, "kubelet", "Pulled", "Successfully pulled image %q in %s (%s including waiting). Image size: 0 bytes.", c.Image, pull, pull)
		k.event(ctx, pod, "kubelet", "Created", "Created container: %s", c.Name)
		k.event(ctx, pod, "kubelet", "Started", "Started container %s", c.Name)
	}
}

// event records one Event about pod, as its source would.
func (k *kubelet) event(ctx context.Context, pod *corev1.Pod, source, reason, format string, args ...any) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: pod.Name + "."},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         reason, Message: fmt.Sprintf(format, args...), Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: source}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	_ = k.Create(ctx, ev) // as the kubelet's: an event lost is no failure
}

// pulling plays the time a worker pod takes from its node to its running
// containers (its job's Scenario.Pull): the first time it sees the pod it
// binds it (PodScheduled true, containers in ContainerCreating) and says how
// long to wait; it returns 0 once the pull is over, or for a pod with none.
// scheduled is when the pod was bound (to the second, as the API server
// keeps it).
func (k *kubelet) pulling(ctx context.Context, pod *corev1.Pod, now metav1.Time) (scheduled metav1.Time, wait time.Duration) {
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
	if scheduled.IsZero() {
		scheduled = now
		if pull > 0 {
			pod.Status.Phase = corev1.PodPending
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}}
			pod.Status.ContainerStatuses = nil
			for _, c := range pod.Spec.Containers {
				pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
					Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
				})
				k.event(ctx, pod, "kubelet", "Pulling", "Pulling image %q", c.Image)
			}
			return scheduled, pull
		}
	}
	end := scheduled.Add(pull)
	if pull == 0 || !now.Time.Before(end) {
		return scheduled, 0
	}
	return scheduled, end.Sub(now.Time)
}
