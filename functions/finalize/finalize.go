// Package finalize is the Finalize function: on a finished message it
// discovers every checkpoint the run wrote (Ray Train's layout in the
// bucket), writes the terminal record, hands the cluster to the next queued
// run or scales its workers to zero, and publishes the terminal CloudEvent.
// Running it twice publishes nothing new.
package finalize

import (
	"context"
	"errors"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Handler handles finished messages.
type Handler struct{ Deps *pipeline.Deps }

// Handle finalizes the run the message names.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	d := h.Deps
	_, rec, err := d.StepRun(ctx, e)
	if err != nil {
		return err
	}
	switch {
	case rec.Phase == runs.Finishing:
		if rec, err = h.conclude(ctx, rec); err != nil {
			return err
		}
	case rec.Unannounced():
		// An earlier delivery ended it and died before announcing it (the
		// sweep resends such runs here); finish what it left.
	default:
		d.Log.Info("duplicate_ignored", "run_id", rec.RunID, "phase", rec.Phase)
		return nil
	}
	// The cluster first, the event last: until the event has gone out the
	// run is listed as unannounced and the sweep sends it here again, so a
	// delivery that dies anywhere in between leaves nothing undone.
	if err := h.release(ctx, rec); err != nil {
		return err
	}
	if rec.Phase != runs.Rejected && !rec.WasPublished(runs.Accepted) {
		// A run cancelled before the delivery that recorded it announced
		// it: subscribers get accepted before its end, as for every run.
		if rec, err = d.Announce(ctx, rec, runs.Accepted); err != nil {
			return err
		}
	}
	_, err = d.Announce(ctx, rec, rec.Phase)
	return err
}

// conclude discovers the run's checkpoints and writes its terminal record.
// Results it cannot read (no permission on the bucket, a malformed object)
// end the run FAILED all the same, so its cluster is released.
func (h *Handler) conclude(ctx context.Context, rec *runs.Record) (*runs.Record, error) {
	res := &checkpoints.Result{Checkpoints: []checkpoints.Checkpoint{}}
	var unreadable error
	for n := 1; n <= rec.Attempt && rec.Spec != nil; n++ {
		bucket, exp := pipeline.Experiment(rec, n)
		r, err := checkpoints.Discover(ctx, h.Deps.Objects.Bucket(bucket), exp)
		if pipeline.Unreadable(err) {
			unreadable = err
			break
		}
		if err != nil {
			return nil, err
		}
		merge(res, r)
	}
	rec, err := h.Deps.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		return r.MarkEnded(res, unreadable, h.Deps.Time())
	})
	if err != nil {
		return nil, err
	}
	h.Deps.Log.Info("run_ended", "run_id", rec.RunID, "phase", rec.Phase, "reason", rec.Reason, "message", rec.Message, "checkpoints", len(res.Checkpoints))
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

// release gives the cluster up: the first queued run gets it, else the
// workers go to zero. A cancelled run's RayJob is deleted first, in case it
// was created after the cancellation was recorded.
func (h *Handler) release(ctx context.Context, rec *runs.Record) error {
	d := h.Deps
	if rec.Cluster == "" {
		return nil
	}
	if rec.Phase == runs.Cancelled && rec.Attempt > 0 {
		if err := d.DeleteRayJob(ctx, rec.Namespace, names.RayJob(rec.RunID, rec.Attempt)); err != nil {
			return err
		}
	}
	lease, next, err := d.Leases.Release(ctx, rec.Namespace, rec.Cluster, rec.RunID)
	if err != nil {
		return err
	}
	for next != "" {
		waiting, err := h.waiting(ctx, next)
		if err != nil {
			return err
		}
		if waiting {
			d.Log.Info("cluster_handed_over", "run_id", rec.RunID, "cluster", rec.Cluster, "next_run_id", next)
			return d.StartAttempt(ctx, next, 1, "", "")
		}
		// The next run no longer waits (it ended, cancelled while queued,
		// or its record is gone): pass the cluster on.
		d.Log.Info("lease_released", "run_id", next, "cluster", rec.Cluster, "why", "no longer waiting")
		if lease, next, err = d.Leases.Release(ctx, rec.Namespace, rec.Cluster, next); err != nil {
			return err
		}
	}
	if lease.Holder != "" {
		return nil // this run never held the cluster; its holder keeps the workers
	}
	changed, err := d.ScaleToZero(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return err
	}
	if changed {
		d.Log.Info("workers_scaled_to_zero", "run_id", rec.RunID, "cluster", rec.Namespace+"/"+rec.Cluster)
	}
	return nil
}

// waiting reports whether a run the cluster is handed to can take it: it
// still waits for it, or has it already. A run that is ending (FINISHING)
// keeps the lease; its own finalize passes it on.
func (h *Handler) waiting(ctx context.Context, runID string) (bool, error) {
	rec, err := h.Deps.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !rec.Phase.Terminal(), nil
}
