package kubesim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
		cond(corev1.PodScheduled), cond(corev1.PodInitialized),
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
	return ctrl.Result{}, nil
}
