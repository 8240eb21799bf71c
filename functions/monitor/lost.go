package monitor

import (
	"context"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/runs"
)

// A worker pod's own evidence of its node's reclaim (the DisruptionTarget
// condition, the Failed phase with reason Terminated) lasts only as long as
// the pod: KubeRay v1.5 deletes a worker pod in phase Failed on its next
// reconcile, within seconds (raycluster_controller.go, reconcilePods and
// shouldDeletePod), long before the monitor's next tick. What lasts is the
// Event KubeRay records on the RayCluster when it does:
//
//	DeletedWorkerPod: Deleted worker Pod <ns>/<pod>; Pod status: Failed; Pod restart policy: …
//
// Events live an hour on the API server (kube-apiserver --event-ttl; GKE
// keeps the default). A worker pod's restart policy is Always (the
// manifests set none), so the kubelet restarts a failed container in place
// and the pod reaches phase Failed only when its node is shut down or the
// kubelet evicts it: the node went away under the attempt
// (https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/,
// https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/).

// reasonDeletedWorkerPod is the reason of KubeRay's Event (utils.DeletedWorkerPod).
const reasonDeletedWorkerPod = "DeletedWorkerPod"

// deletedFailed matches the message of a DeletedWorkerPod Event for a pod
// deleted in phase Failed; the event correlator may prefix a message with
// "(combined from similar events): ".
var deletedFailed = regexp.MustCompile(`Deleted worker Pod [^/ ]+/([^; ]+); Pod status: Failed;`)

// lostWorker is the pod a KubeRay Event says was deleted in phase Failed,
// and when; "" when the Event says nothing of the kind.
func lostWorker(e *corev1.Event) (pod string, at time.Time) {
	if e.Reason != reasonDeletedWorkerPod || e.InvolvedObject.Kind != "RayCluster" {
		return "", time.Time{}
	}
	m := deletedFailed.FindStringSubmatch(e.Message)
	if m == nil {
		return "", time.Time{}
	}
	return m[1], eventTime(e)
}

// eventTime is when the Event was last seen: core/v1 recorders set
// LastTimestamp, events.k8s.io/v1 ones EventTime or the series.
func eventTime(e *corev1.Event) time.Time {
	at := e.LastTimestamp.Time
	for _, t := range []time.Time{e.FirstTimestamp.Time, e.EventTime.Time, e.CreationTimestamp.Time} {
		if t.After(at) {
			at = t
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(at) {
		at = e.Series.LastObservedTime.Time
	}
	return at
}

// lostDuring is the evidence the Events show of worker pods the attempt
// lost to their nodes, as "pod: …"; an Event from before the attempt began
// is an earlier attempt's.
func lostDuring(a *runs.Attempt, events []corev1.Event) []string {
	var out []string
	for i := range events {
		pod, at := lostWorker(&events[i])
		if pod == "" || a == nil || at.Before(a.CreatedAt) {
			continue
		}
		out = append(out, pod+": deleted by KubeRay in phase Failed (its node shut down or evicted it)")
	}
	return out
}

// lostEvents lists KubeRay's DeletedWorkerPod Events on the RayCluster
// cluster in namespace, or on every RayCluster there when cluster is "".
func (h *Handler) lostEvents(ctx context.Context, namespace, cluster string) ([]corev1.Event, error) {
	return h.Deps.ClusterEvents(ctx, namespace, cluster, reasonDeletedWorkerPod)
}

// listLost lists the DeletedWorkerPod Events of every RayCluster in the
// namespaces runs may use, by namespace/cluster: one LIST a namespace a
// sweep.
func (h *Handler) listLost(ctx context.Context) (map[string][]corev1.Event, error) {
	out := map[string][]corev1.Event{}
	for _, ns := range h.Deps.Config.Namespaces {
		events, err := h.lostEvents(ctx, ns, "")
		if err != nil {
			return nil, err
		}
		for _, e := range events {
			key := ns + "/" + e.InvolvedObject.Name
			out[key] = append(out[key], e)
		}
	}
	return out, nil
}
