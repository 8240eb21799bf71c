package monitor

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// workers observes the worker pods of the run's cluster: how many run, why
// one is pending, which Kubernetes marked as disrupted, and which KubeRay
// deleted after their nodes went away (lost.go).
func (h *Handler) workers(ctx context.Context, rec *runs.Record, listed *listing) (*Workers, error) {
	var pods []corev1.Pod
	var events []corev1.Event
	if listed != nil {
		pods = listed.workers[rec.Namespace+"/"+rec.Cluster]
		events = listed.lost[rec.Namespace+"/"+rec.Cluster]
	} else {
		var err error
		if pods, err = h.Deps.WorkerPods(ctx, rec.Namespace, rec.Cluster); err != nil {
			return nil, err
		}
		if events, err = h.lostEvents(ctx, rec.Namespace, rec.Cluster); err != nil {
			return nil, err
		}
	}
	s := rec.Spec
	w := &Workers{Need: (s.Training.Workers + s.Cluster.Workers.GPUs - 1) / s.Cluster.Workers.GPUs, ServedOn: -1}
	w.Disrupted = lostDuring(rec.CurrentAttempt(), events)
	var up startup
	for _, p := range pods {
		if why, at := disruption(&p); why != "" {
			// A pod an earlier attempt lost may linger until KubeRay
			// deletes it: it says nothing of this attempt.
			if a := rec.CurrentAttempt(); a == nil || at.IsZero() || !at.Before(a.CreatedAt) {
				w.Disrupted = append(w.Disrupted, p.Name+": "+why)
			}
			continue
		}
		switch {
		case p.DeletionTimestamp != nil:
		case p.Status.Phase == corev1.PodRunning:
			w.Running++
			up.add(&p)
			// By the keys that tell tiers apart: GKE adds keys of its
			// own to a pod's node selector at admission.
			for i := range s.Tiers() {
				if manifests.OnTier(s, i, p.Spec.NodeSelector) {
					w.ServedOn = max(w.ServedOn, i)
				}
			}
		case p.Status.Phase == corev1.PodPending:
			w.PendingPods = append(w.PendingPods, p.Name)
			if w.Pending != "" {
				continue
			}
			w.Pending = p.Name + " pending"
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
					w.Pending = p.Name + ": " + c.Message
				}
			}
		}
	}
	if w.Running >= w.Need {
		w.Startup = up.value()
	}
	return w, nil
}

// startup gathers, over the running worker pods, when the last was bound
// to a node and when the last one's containers started.
type startup struct {
	runs.Startup
	unknown bool // a running pod that does not say
}

func (u *startup) add(p *corev1.Pod) {
	var scheduled, started time.Time
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			scheduled = c.LastTransitionTime.Time
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			u.unknown = true
			return
		}
		started = later(started, c.State.Running.StartedAt.Time)
	}
	if scheduled.IsZero() || started.IsZero() {
		u.unknown = true
		return
	}
	u.ScheduledAt, u.StartedAt = later(u.ScheduledAt, scheduled), later(u.StartedAt, started)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// value is the start-up of the pods added, nil when one did not say or
// none was added.
func (u *startup) value() *runs.Startup {
	if u.unknown || u.StartedAt.IsZero() {
		return nil
	}
	s := u.Startup
	return &s
}

// listWorkers lists the worker pods of every RayCluster in the namespaces
// runs may use, by namespace/cluster: one LIST a namespace a sweep.
func (h *Handler) listWorkers(ctx context.Context) (map[string][]corev1.Pod, error) {
	out := map[string][]corev1.Pod{}
	for _, ns := range h.Deps.Config.Namespaces {
		pods, err := h.Deps.WorkerPods(ctx, ns, "")
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			key := ns + "/" + p.Labels[names.LabelRayCluster]
			out[key] = append(out[key], p)
		}
	}
	return out, nil
}

// notePreemptions records evidence of preemption the attempt lacked.
func (h *Handler) notePreemptions(ctx context.Context, rec *runs.Record, seen []string) error {
	if len(seen) == 0 {
		return nil
	}
	err := h.note(ctx, rec.RunID, func(r *runs.Record) bool { return r.NotePreemptions(rec.Attempt, seen) })
	if err == nil {
		h.Deps.Log.Warn("preemption_seen", "run_id", rec.RunID, "attempt", rec.Attempt, "evidence", seen)
	}
	return err
}

// noteWaiting records why the attempt waits for capacity, when that
// changed: watch and status show it.
func (h *Handler) noteWaiting(ctx context.Context, rec *runs.Record, why string) error {
	if a := rec.CurrentAttempt(); why == "" || a == nil || a.Waiting == why {
		return nil
	}
	return h.note(ctx, rec.RunID, func(r *runs.Record) bool { return r.NoteWaiting(rec.Attempt, why) })
}

// note writes what changed reports it changed in the run's record; nothing
// when it reports no change.
func (h *Handler) note(ctx context.Context, runID string, changed func(*runs.Record) bool) error {
	_, err := h.Deps.Runs.Update(ctx, runID, func(r *runs.Record) error {
		if !changed(r) {
			return runs.ErrNoChange
		}
		return nil
	})
	return err
}

// nextTier moves the attempt's pending workers to the next capacity tier:
// the worker group's placement changes, KubeRay replaces the pending pods
// the check saw, and the record says from when.
func (h *Handler) nextTier(ctx context.Context, rec *runs.Record, why string, pending []string) error {
	tier := rec.CurrentAttempt().Tier + 1
	code, err := manifests.TrainerCode()
	if err != nil {
		return err
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
