package monitor

import (
	"context"
	"fmt"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/runs"
)

// failedCreateWorkerPod is the reason of the ReplicaFailure condition
// KubeRay sets on a RayCluster whose worker pod the API server refused
// (utils.ErrFailedCreateWorkerPod; it records a FailedToCreateWorkerPod
// event on the RayCluster too). A pod Autopilot's admission refuses (a
// request over its node class's maximum) never exists, so the pod listing
// shows nothing: only the RayCluster says why.
const failedCreateWorkerPod = "FailedCreateWorkerPod"

// notCreated says why KubeRay cannot create the worker pods the attempt
// lacks, "" when it says nothing: read only while an attempt that has not
// started has fewer worker pods than it needs and none pending.
func (h *Handler) notCreated(ctx context.Context, rec *runs.Record, w *Workers) (string, error) {
	if a := rec.CurrentAttempt(); a == nil || a.RunningAt != nil || w.Pending != "" || w.Running+len(w.PendingPods) >= w.Need {
		return "", nil
	}
	rc, err := h.Deps.Ray.RayV1().RayClusters(rec.Namespace).Get(ctx, rec.Cluster, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("get raycluster %s/%s: %w", rec.Namespace, rec.Cluster, err)
	}
	return workerPodRefusal(rc), nil
}

// workerPodRefusal is the RayCluster's FailedCreateWorkerPod condition as
// one line naming KubeRay's event, "" without one. KubeRay's message is
// its error joined to the API server's (errors.Join: one line each).
func workerPodRefusal(rc *rayv1.RayCluster) string {
	c := meta.FindStatusCondition(rc.Status.Conditions, string(rayv1.RayClusterReplicaFailure))
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != failedCreateWorkerPod {
		return ""
	}
	var parts []string
	for _, l := range strings.Split(c.Message, "\n") {
		if l = strings.TrimSpace(l); l != "" && l != failedCreateWorkerPod {
			parts = append(parts, l)
		}
	}
	return "worker pods not created (KubeRay FailedToCreateWorkerPod): " + strings.Join(parts, "; ")
}
