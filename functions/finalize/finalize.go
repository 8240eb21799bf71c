// Package finalize is the Finalize function: on a finished message it
// discovers every checkpoint the run wrote (Ray Train's layout in the
// bucket), writes the terminal record, publishes the terminal CloudEvent,
// and hands the cluster to the next queued run or scales its workers to
// zero. Running it twice publishes nothing new.
package finalize

import (
	"context"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Handler handles finished messages.
type Handler struct{ *pipeline.Deps }

// Handle finalizes the run the message names.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	_, rec, err := h.StepRun(ctx, e)
	if err != nil {
		return err
	}
	switch {
	case rec.Phase == runs.Finishing:
		if rec, err = h.conclude(ctx, rec); err != nil {
			return err
		}
	case rec.Phase.Terminal():
		// An earlier delivery concluded it; finish what it may not have.
	default:
		h.Log.Info("duplicate_ignored", "run_id", rec.RunID, "phase", rec.Phase)
		return nil
	}
	if rec, err = h.Announce(ctx, rec, eventPhase(rec.Phase)); err != nil {
		return err
	}
	return h.release(ctx, rec)
}

// conclude discovers the run's checkpoints and writes its terminal record.
func (h *Handler) conclude(ctx context.Context, rec *runs.Record) (*runs.Record, error) {
	res := &checkpoints.Result{Checkpoints: []checkpoints.Checkpoint{}}
	for n := 1; n <= rec.Attempt && rec.Spec != nil; n++ {
		bucket, exp := pipeline.Experiment(rec, n)
		r, err := checkpoints.Discover(ctx, h.Objects.Bucket(bucket), exp)
		if err != nil {
			return nil, err
		}
		merge(res, r)
	}
	phase, reason := runs.Failed, rec.Reason
	switch rec.Outcome {
	case pipeline.OutcomeSucceeded:
		phase = runs.Succeeded
		if res.Latest == nil {
			phase, reason = runs.Failed, "the job succeeded but wrote no complete checkpoint (adapter files missing)"
		}
	case pipeline.OutcomeCancelled:
		phase = runs.Cancelled
	}
	if reason == "" && phase == runs.Failed {
		reason = "failed"
	}
	rec, err := h.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		if r.Phase != runs.Finishing {
			return runs.ErrNoChange
		}
		r.Result, r.Reason = res, reason
		r.Enter(phase, h.Time())
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.Log.Info("run_ended", "run_id", rec.RunID, "phase", rec.Phase, "reason", rec.Reason, "checkpoints", len(res.Checkpoints))
	return rec, nil
}

// merge adds an attempt's result to the run's: every checkpoint, the newest
// complete one, the best, and the final metrics of the last attempt.
func merge(into, r *checkpoints.Result) {
	into.Checkpoints = append(into.Checkpoints, r.Checkpoints...)
	into.Incomplete = append(into.Incomplete, r.Incomplete...)
	into.Reports += r.Reports
	if r.Latest != nil {
		into.Latest = r.Latest
	}
	if r.Best != nil && (into.Best == nil || better(r.Best, into.Best)) {
		into.Best = r.Best
	}
	if r.FinalMetrics != nil {
		into.FinalMetrics = r.FinalMetrics
	}
	if r.Trial != "" {
		into.Trial = r.Trial
	}
	into.Mark = r.Mark
}

func better(a, b *checkpoints.Checkpoint) bool {
	al, aok := a.Metrics["loss"]
	bl, bok := b.Metrics["loss"]
	return aok && (!bok || al < bl)
}

func eventPhase(p runs.Phase) string {
	switch p {
	case runs.Succeeded:
		return "succeeded"
	case runs.Cancelled:
		return "cancelled"
	}
	return "failed"
}

// release gives the cluster up: the first queued run gets it, else the
// workers go to zero. A cancelled run's RayJob is deleted first, in case it
// was created after the cancellation was recorded.
func (h *Handler) release(ctx context.Context, rec *runs.Record) error {
	if rec.Cluster == "" {
		return nil
	}
	if rec.Phase == runs.Cancelled && rec.Attempt > 0 {
		if err := h.DeleteRayJob(ctx, rec.Namespace, names.RayJob(rec.RunID, rec.Attempt)); err != nil {
			return err
		}
	}
	lease, next, err := h.Leases.Release(ctx, rec.Namespace, rec.Cluster, rec.RunID)
	if err != nil {
		return err
	}
	if next != "" {
		h.Log.Info("cluster_handed_over", "run_id", rec.RunID, "cluster", rec.Cluster, "next_run_id", next)
		return h.StartAttempt(ctx, next, 1, "", "")
	}
	if lease.Holder != "" {
		return nil // this run never held the cluster; its holder keeps the workers
	}
	changed, err := h.ScaleToZero(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return err
	}
	if changed {
		h.Log.Info("workers_scaled_to_zero", "run_id", rec.RunID, "cluster", rec.Namespace+"/"+rec.Cluster)
	}
	return nil
}
