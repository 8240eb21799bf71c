// Package finalize is the Finalize function: on a finished message it
// discovers every checkpoint the run wrote (Ray Train's layout in the
// bucket), writes the terminal record, hands the cluster to the next queued
// run or scales its workers to zero, and publishes the terminal CloudEvent.
// Running it twice publishes nothing new.
package finalize

import (
	"context"
	"errors"
	"strings"

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
	case rec.Unannounced():
		// An earlier delivery ended it and died before announcing it (the
		// sweep resends such runs here); finish what it left.
	default:
		h.Log.Info("duplicate_ignored", "run_id", rec.RunID, "phase", rec.Phase)
		return nil
	}
	// The cluster first, the event last: until the event has gone out the
	// run is listed as unannounced and the sweep sends it here again, so a
	// delivery that dies anywhere in between leaves nothing undone.
	if err := h.release(ctx, rec); err != nil {
		return err
	}
	_, err = h.Announce(ctx, rec, eventPhase(rec.Phase))
	return err
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

// eventPhase is the public event name of a terminal phase.
func eventPhase(p runs.Phase) string { return strings.ToLower(string(p)) }

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
	for next != "" {
		waiting, err := h.waiting(ctx, next)
		if err != nil {
			return err
		}
		if waiting {
			h.Log.Info("cluster_handed_over", "run_id", rec.RunID, "cluster", rec.Cluster, "next_run_id", next)
			return h.StartAttempt(ctx, next, 1, "", "")
		}
		// The next run no longer waits (it ended, cancelled while queued,
		// or its record is gone): pass the cluster on.
		h.Log.Info("lease_released", "run_id", next, "cluster", rec.Cluster, "why", "no longer waiting")
		if lease, next, err = h.Leases.Release(ctx, rec.Namespace, rec.Cluster, next); err != nil {
			return err
		}
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

// waiting reports whether a run the cluster is handed to can take it: it
// still waits for it, or has it already. A run that is ending (FINISHING)
// keeps the lease; its own finalize passes it on.
func (h *Handler) waiting(ctx context.Context, runID string) (bool, error) {
	rec, err := h.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !rec.Phase.Terminal(), nil
}
