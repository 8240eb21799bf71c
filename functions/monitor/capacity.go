package monitor

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
)

// workers observes the worker pods of the run's cluster: how many run, why
// one is pending, and which Kubernetes marked as disrupted.
func (h *Handler) workers(ctx context.Context, rec *runs.Record) (*Workers, error) {
	pods, err := h.Deps.WorkerPods(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return nil, err
	}
	s := rec.Spec
	w := &Workers{Need: (s.Training.Workers + s.Cluster.Workers.GPUs - 1) / s.Cluster.Workers.GPUs}
	for _, p := range pods {
		if why := disruption(&p); why != "" {
			w.Disrupted = append(w.Disrupted, p.Name+": "+why)
			continue
		}
		switch {
		case p.DeletionTimestamp != nil:
		case p.Status.Phase == corev1.PodRunning:
			w.Running++
		case p.Status.Phase == corev1.PodPending && w.Pending == "":
			w.Pending = p.Name + " pending"
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
					w.Pending = p.Name + ": " + c.Message
				}
			}
		}
	}
	return w, nil
}

// disruption is why Kubernetes took the pod's node away, "" when it did
// not: the DisruptionTarget condition it sets before a pod is deleted or
// terminated for a reason outside the pod
// (https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions:
// TerminationByKubelet for a graceful node shutdown, which is how GKE
// stops the pods of a reclaimed Spot VM,
// https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms), or
// the Failed phase with reason Terminated or NodeShutdown the kubelet gives
// pods on a node shutting down
// (https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/).
func disruption(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return c.Reason
		}
	}
	if p.Status.Phase == corev1.PodFailed && (p.Status.Reason == "Terminated" || p.Status.Reason == "NodeShutdown") {
		return p.Status.Reason
	}
	return ""
}

// notePreemptions records evidence of preemption the attempt lacked.
func (h *Handler) notePreemptions(ctx context.Context, rec *runs.Record, seen []string) error {
	if len(seen) == 0 {
		return nil
	}
	attempt := rec.Attempt
	_, err := h.Deps.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		if !r.NotePreemptions(attempt, seen) {
			return runs.ErrNoChange
		}
		return nil
	})
	if err == nil {
		h.Deps.Log.Warn("preemption_seen", "run_id", rec.RunID, "attempt", attempt, "evidence", seen)
	}
	return err
}

// noteWaiting records why the attempt waits for capacity, when that
// changed: watch and status show it.
func (h *Handler) noteWaiting(ctx context.Context, rec *runs.Record, why string) error {
	if a := rec.CurrentAttempt(); why == "" || a == nil || a.Waiting == why {
		return nil
	}
	attempt := rec.Attempt
	_, err := h.Deps.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		if !r.NoteWaiting(attempt, why) {
			return runs.ErrNoChange
		}
		return nil
	})
	return err
}

// nextTier moves the attempt's pending workers to the next capacity tier:
// the worker group's placement changes, KubeRay replaces the pending pods,
// and the record says from when.
func (h *Handler) nextTier(ctx context.Context, rec *runs.Record, why string) error {
	a := rec.CurrentAttempt()
	tier := a.Tier + 1
	code, err := manifests.TrainerCode()
	if err != nil {
		return err
	}
	pods, err := h.Deps.WorkerPods(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return err
	}
	var pending []string
	for _, p := range pods {
		if p.Status.Phase == corev1.PodPending && p.DeletionTimestamp == nil {
			pending = append(pending, p.Name)
		}
	}
	if err := h.Deps.PlaceWorkers(ctx, manifests.RayCluster(rec.Spec, code, tier), pending); err != nil {
		return err
	}
	attempt := rec.Attempt
	_, err = h.Deps.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		return r.MoveTier(attempt, tier, why, h.Deps.Time())
	})
	if err == nil {
		h.Deps.Log.Warn("capacity_tier_moved", "run_id", rec.RunID, "attempt", attempt, "tier", tier+1, "capacity", rec.Spec.Tiers()[tier].Name(), "why", why, "pending_pods", pending)
	}
	return err
}
