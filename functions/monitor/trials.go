package monitor

import (
	"context"
	"errors"
	"slices"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// earlyStop notes a trial's held-out losses while its job runs in its sweep's record
// (every attempt's, by step: a resumed attempt's result.json has only its
// own) and applies the sweep's median rule: why the trial stops now, or
// "" when it goes on (or is no trial, or its sweep stops none).
func (h *Handler) earlyStop(ctx context.Context, rec *runs.Record, files attemptFiles) (string, error) {
	if rec.Trial == nil || !rec.Phase.HasJob() || rec.CancelRequested {
		return "", nil
	}
	sw, err := h.Deps.Sweeps.Get(ctx, rec.Trial.SweepID)
	if err != nil {
		return "", err
	}
	t := sw.Trial(rec.RunID)
	if t == nil || sw.Spec.Sweep.EarlyStopping.Rule != spec.StopMedian || sw.Phase.Terminal() {
		return "", nil
	}
	res, err := checkpoints.Discover(ctx, files.store, files.exp)
	if gcp.Unreadable(err) {
		return "", nil // the check itself fails the run on what it cannot read
	} else if err != nil {
		return "", err
	}
	by := map[int64]float64{}
	for i, s := range t.EvalSteps {
		by[s] = t.EvalLosses[i]
	}
	steps, cur := pipeline.EvalLosses(res.Checkpoints)
	for i, s := range steps {
		by[s] = cur[i]
	}
	steps, losses := pipeline.MergeLosses(by)
	if len(losses) > len(t.EvalLosses) {
		sw, err = h.Deps.Sweeps.Update(ctx, sw.SweepID, func(r *sweeps.Record) error {
			rt := r.Trial(rec.RunID)
			if rt == nil || len(rt.EvalLosses) >= len(losses) {
				return sweeps.ErrNoChange
			}
			rt.EvalLosses, rt.EvalSteps = slices.Clone(losses), slices.Clone(steps)
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	return sweeps.MedianStop(sw, rec.RunID, losses), nil
}

// advanceSweep moves a sweep on for a message or the tick: a trial the
// sweep started but whose delivery died before recording it, the next
// trials, a cancellation, the end (sent to finalize).
func (h *Handler) advanceSweep(ctx context.Context, id string) error {
	err := h.Deps.AdvanceSweep(ctx, id, "", h.Deps.SendSweepEnd)
	if errors.Is(err, sweeps.ErrNotFound) {
		return pipeline.Permanent(err)
	}
	return err
}

// advanceSweeps moves every sweep that has not ended and been announced
// on (advanceSweep): one listing of the sweep records, then each one's
// trials.
func (h *Handler) advanceSweeps(ctx context.Context) []error {
	sums, err := h.Deps.Sweeps.List(ctx)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, s := range sums {
		if s.Phase.Terminal() && !s.Unannounced {
			continue
		}
		if err := h.advanceSweep(ctx, s.SweepID); err != nil {
			h.Deps.Log.Warn("sweep_check_failed", "sweep_id", s.SweepID, "error", err.Error(), "permanent", pipeline.IsPermanent(err))
			errs = append(errs, err)
		}
	}
	return errs
}
