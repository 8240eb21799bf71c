package finalize

import (
	"context"
	"time"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// release gives the cluster up: the first queued run gets it, else the
// workers go to zero. A cancelled run's RayJob is deleted first, in case it
// was created after the cancellation was recorded. A failed run whose spec
// keeps its head for a look (debug.keepFailedFor) keeps the cluster: its
// workers go to zero, its head pod stays, and the monitor's sweep passes
// the cluster on when the time is up (keptHeads); it returns the head
// pod's name then.
func (h *Handler) release(ctx context.Context, rec *runs.Record) (head string, _ error) {
	d := h.Deps
	if rec.Cluster == "" {
		return "", nil
	}
	if rec.Outcome == runs.OutcomeCancelled && rec.Attempt > 0 {
		if err := d.DeleteRayJob(ctx, rec.Namespace, names.RayJob(rec.RunID, rec.Attempt)); err != nil {
			return "", err
		}
	}
	keep := rec.KeepsHead(d.Time())
	if keep {
		var err error
		if head, err = d.HeadPod(ctx, rec.Namespace, rec.Cluster); err != nil {
			return "", err
		}
		keep = head != ""
	}
	if !keep {
		lease, err := d.PassOn(ctx, rec.Namespace, rec.Cluster, rec.RunID)
		if err != nil {
			return "", err
		}
		if lease.Holder != "" {
			return "", nil // this run never held the cluster; its holder keeps the workers
		}
	}
	changed, err := d.ScaleToZero(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return "", err
	}
	if changed {
		d.Log.Info("workers_scaled_to_zero", "run_id", rec.RunID, "cluster", rec.Namespace+"/"+rec.Cluster)
	}
	if keep {
		d.Log.Info("head_kept", "run_id", rec.RunID, "cluster", rec.Namespace+"/"+rec.Cluster, "pod", head, "for", time.Duration(rec.Spec.Debug.KeepFailedFor).String())
	}
	return head, nil
}
