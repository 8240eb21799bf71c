package kubesim

import (
	"context"
	"fmt"
	"sort"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/pkg/manifests"
)

// Capacity in the simulator: GKE's nodes appear only where a capacity tier
// has them. A worker pod asks for a tier through its node selector
// (manifests.WorkerPlacement); the Scenario of the RayJob running on its
// cluster may refuse that tier for a while, and the pod then stays Pending
// the way it does on GKE when the cluster autoscaler cannot get the nodes:
// PodScheduled False with reason Unschedulable and the scheduler's message,
// and a FailedScaleUp event from the cluster autoscaler
// (https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md,
// "What events are emitted by CA?"; GKE writes "GCE out of resources" for
// a zone without capacity).

// nodesFor is how long a worker pod waits for a RayJob to appear on its
// cluster before the simulator gives it a node unasked: the pipeline
// creates the RayJob right after the cluster, and a refusal is the job's.
const nodesFor = 10 * time.Second

// awaitingJob is the refusal of a worker pod whose cluster has no RayJob
// yet: it waits, without the autoscaler's event.
const awaitingJob = "awaiting the cluster's RayJob"

// TierOf is the capacity tier type a pod's node selector asks for, read as
// the monitor reads it (manifests.TierType): by the keys that tell tiers
// apart, whatever others the selector has.
func TierOf(sel map[string]string) string { return manifests.TierType(sel) }

// refusal is the tier that has no node for a worker pod now, awaitingJob
// while its cluster has no RayJob, "" when it gets one.
func (k *kubelet) refusal(ctx context.Context, pod *corev1.Pod) string {
	if pod.Labels[utils.RayNodeTypeLabelKey] != string(rayv1.WorkerNode) || k.sim == nil {
		return ""
	}
	job := k.activeJob(ctx, pod)
	if job == nil {
		if time.Since(pod.CreationTimestamp.Time) < nodesFor {
			return awaitingJob
		}
		return ""
	}
	sc := k.scenario(ctx, job)
	tier := TierOf(pod.Spec.NodeSelector)
	d, refused := sc.Refuse[tier]
	if !refused || d > 0 && time.Since(job.CreationTimestamp.Time) >= d {
		return ""
	}
	return tier
}

// activeJob is the newest RayJob on the pod's cluster that has not ended.
func (k *kubelet) activeJob(ctx context.Context, pod *corev1.Pod) *rayv1.RayJob {
	jobs := &rayv1.RayJobList{}
	if err := k.List(ctx, jobs, client.InNamespace(pod.Namespace)); err != nil {
		return nil
	}
	var active []*rayv1.RayJob
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.Spec.ClusterSelector[utils.RayJobClusterSelectorKey] == pod.Labels[utils.RayClusterLabelKey] && !rayv1.IsJobDeploymentTerminal(j.Status.JobDeploymentStatus) && j.DeletionTimestamp == nil {
			active = append(active, j)
		}
	}
	if len(active) == 0 {
		return nil
	}
	sort.Slice(active, func(a, b int) bool { return active[a].CreationTimestamp.After(active[b].CreationTimestamp.Time) })
	return active[0]
}

// scenario is the job's Scenario, asked once per job.
func (k *kubelet) scenario(ctx context.Context, job *rayv1.RayJob) Scenario {
	if v, ok := k.scenarios.Load(job.UID); ok {
		return v.(Scenario)
	}
	sc := DefaultScenario()
	if k.sim.o.Scenario != nil {
		sc = k.sim.o.Scenario(ctx, job.DeepCopy())
	}
	k.scenarios.Store(job.UID, sc)
	return sc
}

// unschedulable leaves the pod Pending as the scheduler and the cluster
// autoscaler do when no node of its tier can be had; once per pod.
func (k *kubelet) unschedulable(ctx context.Context, pod *corev1.Pod, tier string) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return nil
		}
	}
	msg := "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg, LastTransitionTime: metav1.Now()}}
	if err := k.Status().Update(ctx, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if tier == awaitingJob {
		return nil
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         "FailedScaleUp",
		Message:        fmt.Sprintf("Node scale up in zones us-central1-b associated with this pod failed: GCE out of resources (%s). Pod is at risk of not being scheduled.", tier),
		Source:         corev1.EventSource{Component: "cluster-autoscaler"},
		Type:           corev1.EventTypeWarning,
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	return client.IgnoreAlreadyExists(k.Create(ctx, ev))
}

// preempt reclaims a worker pod's node as GKE reclaims a Spot VM: graceful
// node shutdown, so the kubelet marks the pod DisruptionTarget
// (TerminationByKubelet) and Failed with reason Terminated
// (https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/).
// KubeRay then deletes the failed pod and creates another.
func (s *Sim) preempt(ctx context.Context, ns, cluster string) (string, error) {
	pods, err := s.clusterPods(ctx, ns, cluster, rayv1.WorkerNode)
	if err != nil {
		return "", err
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
			continue
		}
		now := metav1.Now()
		const msg = "Pod was terminated in response to imminent node shutdown."
		pod.Status.Phase, pod.Status.Reason, pod.Status.Message = corev1.PodFailed, "Terminated", msg
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet", Message: msg, LastTransitionTime: now,
		})
		if err := s.Client.Status().Update(ctx, pod); err != nil {
			return "", err
		}
		return pod.Name, nil
	}
	return "", fmt.Errorf("no running worker pod of %s/%s to preempt", ns, cluster)
}

// waitDeleted blocks until the pod is gone (KubeRay deletes a worker pod in
// phase Failed on its next reconcile), for at most a minute.
func (s *Sim) waitDeleted(ctx context.Context, ns, pod string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := s.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s still there: %w", ns, pod, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitForWorkers blocks until every worker pod the cluster's groups ask for
// runs, as Ray Train waits for its placement group before the first step.
func (t *trainer) waitForWorkers(ctx context.Context) error {
	for !t.workersReady(ctx) {
		if err := t.p.sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// workersReady reports whether as many worker pods run as the cluster's
// worker groups ask for.
func (t *trainer) workersReady(ctx context.Context) bool {
	s := t.p.d.sim
	rc := &rayv1.RayCluster{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: t.ns, Name: t.cluster}, rc); err != nil {
		return false
	}
	pods, err := s.clusterPods(ctx, t.ns, t.cluster, rayv1.WorkerNode)
	if err != nil {
		return false
	}
	want, running := 0, 0
	for _, g := range rc.Spec.WorkerGroupSpecs {
		if g.Replicas != nil {
			want += int(*g.Replicas)
		}
	}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running++
		}
	}
	return running >= want
}

// clusterPods lists the pods of a RayCluster of one node type, by the
// labels KubeRay gives them.
func (s *Sim) clusterPods(ctx context.Context, ns, cluster string, nodeType rayv1.RayNodeType) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	err := s.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{
		utils.RayClusterLabelKey: cluster, utils.RayNodeTypeLabelKey: string(nodeType),
	})
	return pods.Items, err
}
