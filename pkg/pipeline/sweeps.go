package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// SweepStore keeps sweep records (sweeps.Store in production).
type SweepStore interface {
	Create(ctx context.Context, r *sweeps.Record) error
	Get(ctx context.Context, sweepID string) (*sweeps.Record, error)
	Update(ctx context.Context, sweepID string, fn func(*sweeps.Record) error) (*sweeps.Record, error)
	List(ctx context.Context) ([]sweeps.Summary, error)
}

// AdmitSweep records the sweep an accepted spec asks for, under the ID the
// run would have had (so a spec dropped or published twice is one sweep),
// and starts its first trials. A redelivery finds the record and carries
// on from it.
func (d *Deps) AdmitSweep(ctx context.Context, rec *runs.Record) error {
	sw, err := sweeps.NewRecord(rec.RunID, rec.Source, rec.Name, rec.SpecHash, rec.Spec, d.Time())
	if err != nil {
		return Permanent(fmt.Errorf("sweep %s: %w", rec.RunID, err))
	}
	switch err := d.Sweeps.Create(ctx, sw); {
	case errors.Is(err, sweeps.ErrExists):
	case err != nil:
		return err
	default:
		d.Log.Info("sweep_accepted", "sweep_id", sw.SweepID, "source", sw.Source, "name", sw.Name, "trials", len(sw.Trials))
	}
	return d.AdvanceSweep(ctx, sw.SweepID, "", nil)
}

// EndSweep ends a sweep whose trials have all ended: finalize writes its
// report and publishes its event (only finalize may write reports); the
// monitor sends it the sweep's finished message (SendSweepEnd). A function
// that may do neither (Provision) passes none: the monitor's next look at
// the sweep does.
type EndSweep func(ctx context.Context, sw *sweeps.Record) error

// SendSweepEnd is the monitor's EndSweep: the sweep's finished message,
// on which finalize ends it.
func (d *Deps) SendSweepEnd(ctx context.Context, sw *sweeps.Record) error {
	return d.Send(ctx, d.Config.Topics.Finished, Step{SweepID: sw.SweepID})
}

// AdvanceSweep moves sweep id on (sweeps.Advance): it notes what its
// trials' runs say, starts the trials that may start (each run recorded
// and admitted as a spec from the intake would be, each once: a trial a
// dead delivery started but never recorded is recorded here), and, once
// the sweep has ended, ends it with end (none: leaves that to the
// monitor). leaving is a trial run that hands its cluster over
// now (finalize calls before it releases the cluster, so the next trial
// queues on it and gets it without the workers going to zero). It is safe
// to repeat.
func (d *Deps) AdvanceSweep(ctx context.Context, id, leaving string, end EndSweep) error {
	sw, err := d.Sweeps.Get(ctx, id)
	if err != nil {
		return err
	}
	if sw.Phase.Terminal() && sw.Published {
		return nil
	}
	states, recs, err := d.trialStates(ctx, sw)
	if err != nil {
		return err
	}
	if sw.CancelRequested {
		// A trial recorded after the cancellation went out to the trials
		// (by a delivery that started it before): cancelled now.
		for _, rec := range recs {
			if !rec.CancelRequested && !rec.Phase.Terminal() {
				if _, err := d.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error { return r.MarkCancelRequested() }); err != nil {
					return err
				}
			}
		}
	}
	var plan sweeps.Plan
	sw, err = d.Sweeps.Update(ctx, id, func(r *sweeps.Record) error {
		var changed bool
		plan, changed = sweeps.Advance(r, states, leaving, d.Time())
		if !changed {
			return sweeps.ErrNoChange
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("advance sweep %s: %w", id, err)
	}
	var errs []error
	for _, i := range plan.Create {
		errs = append(errs, d.startTrial(ctx, sw, sw.Trials[i-1]))
	}
	if len(plan.Started) > 0 {
		d.Log.Info("sweep_trials_started", "sweep_id", id, "trials", plan.Started)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !sw.Phase.Terminal() || sw.Published {
		return nil
	}
	if plan.Ended {
		d.Log.Info("sweep_ended", "sweep_id", id, "phase", sw.Phase, "best", sw.Best, "message", sw.Message)
	}
	if end == nil {
		return nil // the monitor's next look sends it to finalize
	}
	return end(ctx, sw)
}

// trialStates reads the run of every trial the sweep started that has not
// been noted ended.
func (d *Deps) trialStates(ctx context.Context, sw *sweeps.Record) (map[string]sweeps.TrialState, []*runs.Record, error) {
	out := map[string]sweeps.TrialState{}
	var recs []*runs.Record
	for _, t := range sw.Trials {
		if !t.Active() {
			continue
		}
		rec, err := d.Runs.Get(ctx, t.RunID)
		if errors.Is(err, runs.ErrNotFound) {
			out[t.RunID] = sweeps.TrialState{}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		out[t.RunID] = TrialState(rec, d.Time(), d.Config.GPUHourUSD)
		recs = append(recs, rec)
	}
	return out, recs, nil
}

// TrialState is what a trial's run record tells its sweep: its phase, the
// held-out loss at each checkpoint it found, its best checkpoint by that
// loss, its steps, and the GPU time and cost it used up to now.
func TrialState(rec *runs.Record, now time.Time, price float64) sweeps.TrialState {
	st := sweeps.TrialState{Exists: true, Phase: rec.Phase, Reason: rec.Reason}
	if c := rec.Cause; c != nil {
		st.Cause, st.Summary = c.Kind, c.Summary
	}
	if rec.Progress != nil {
		st.Steps = rec.Progress.Step
	}
	if res := rec.Result; res != nil {
		st.EvalSteps, st.EvalLosses = EvalLosses(res.Checkpoints)
		if b := res.Best; b != nil && res.BestBy == "eval_loss" {
			l := b.Metrics["eval_loss"]
			st.BestEvalLoss, st.BestCheckpoint = &l, b.URI
		}
		for _, c := range res.Checkpoints {
			st.Steps = max(st.Steps, c.Step)
		}
	}
	end := now
	if t, ok := rec.Times[rec.Phase]; ok && rec.Phase.Terminal() {
		end = t
	}
	st.GPUHours, st.CostUSD = events.GPUCost(rec, end, price)
	return st
}

// EvalLosses is the held-out loss at each checkpoint that has one, with
// its step, in the order of their steps (a step saved twice, by a retry,
// once: the later).
func EvalLosses(cks []checkpoints.Checkpoint) (steps []int64, losses []float64) {
	by := map[int64]float64{}
	for _, c := range cks {
		if l, ok := c.Metrics["eval_loss"]; ok {
			by[c.Step] = l
		}
	}
	return MergeLosses(by)
}

// MergeLosses is the losses by step as two lists in step order.
func MergeLosses(by map[int64]float64) (steps []int64, losses []float64) {
	for s := range by {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	for _, s := range steps {
		losses = append(losses, by[s])
	}
	return steps, losses
}

// startTrial records a started trial's run (its spec: the sweep's with the
// trial's values, on its cluster) and admits it as a spec from the intake
// would be; a record that exists already is left to its own chain.
func (d *Deps) startTrial(ctx context.Context, sw *sweeps.Record, t sweeps.Trial) error {
	ts, err := sw.Spec.TrialSpec(t.Params, t.Cluster)
	if err != nil {
		return Permanent(fmt.Errorf("sweep %s, trial %d: %w", sw.SweepID, t.Index, err))
	}
	rec := runs.NewRecord(t.RunID, sw.Source, sw.Name, ts, nil, d.Time())
	// The sweep's spec has the images its own admission gave it: a trial
	// runs the deployment's trainer image only if it is still that one.
	rec.UseImages(d.Config.TrainerImage)
	rec.Trial = &runs.TrialOf{SweepID: sw.SweepID, Index: t.Index, Params: t.Params}
	if sw.CancelRequested {
		// Started before the sweep's cancellation, recorded after it: it
		// goes through a run's cancellation.
		_ = rec.MarkCancelRequested()
	}
	if !d.Config.MayUse(ts.Cluster.Namespace) {
		return Permanent(fmt.Errorf("sweep %s, trial %d: namespace %s is not one of this deployment's", sw.SweepID, t.Index, ts.Cluster.Namespace))
	}
	return d.AdmitNew(ctx, rec)
}

// CancelSweep records a request to cancel the sweep and asks every trial
// still going to stop, each as a run's cancellation does (the monitor acts
// on each); no trial starts after it. The sweep ends cancelled once its
// trials have.
func (d *Deps) CancelSweep(ctx context.Context, id, from string) error {
	sw, err := d.Sweeps.Update(ctx, id, func(r *sweeps.Record) error {
		if r.CancelRequested || r.Phase.Terminal() {
			return sweeps.ErrNoChange
		}
		r.CancelRequested = true
		return nil
	})
	if err != nil {
		return err
	}
	if sw.Phase.Terminal() {
		d.Log.Info("cancel_ignored", "sweep_id", id, "phase", sw.Phase)
		return nil
	}
	d.Log.Info("sweep_cancel_requested", "sweep_id", id, "from", from)
	for _, t := range sw.Trials {
		if !t.Active() {
			continue
		}
		rec, err := d.Runs.Update(ctx, t.RunID, func(r *runs.Record) error { return r.MarkCancelRequested() })
		switch {
		case errors.Is(err, runs.ErrNotFound):
			continue // never recorded: the sweep's advance records it, cancelled
		case err != nil:
			return err
		}
		if err := d.Send(ctx, d.Config.Topics.Submitted, Step{RunID: t.RunID, Attempt: rec.Attempt}); err != nil {
			return err
		}
	}
	return d.Send(ctx, d.Config.Topics.Submitted, Step{SweepID: id})
}

// AnnounceSweep publishes an ended sweep's event once: a delivery claims
// it in the sweep's record first (compare-and-swap), publishes, then
// records it published. A claim another delivery holds is retried later;
// a publish that fails gives the claim up at once.
func (d *Deps) AnnounceSweep(ctx context.Context, id string) error {
	now := d.Time()
	claimed := false
	sw, err := d.Sweeps.Update(ctx, id, func(r *sweeps.Record) error {
		claimed = r.Claim(now)
		if !claimed {
			return sweeps.ErrNoChange
		}
		return nil
	})
	switch {
	case err != nil:
		return err
	case sw.Published:
		return nil
	case !claimed:
		return fmt.Errorf("sweep %s: its %s event: %w", id, sw.Phase.Event(), errClaimed)
	}
	e, err := events.NewSweep(d.Config.EventSource, events.SweepData(sw), now)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, publishWithin)
		err = d.Publisher.Publish(pctx, d.Config.Topics.Events, e.Data(), events.PubSubAttributes(e))
		cancel()
	}
	if err == nil {
		d.Log.Info("event_published", "sweep_id", id, "type", e.Type())
		err = d.toBus(ctx, id, e)
	}
	if err != nil {
		_, _ = d.Sweeps.Update(ctx, id, func(r *sweeps.Record) error { r.Publishing = nil; return nil })
		return fmt.Errorf("publish the event of sweep %s: %w", id, err)
	}
	_, err = d.Sweeps.Update(ctx, id, func(r *sweeps.Record) error {
		if r.Published {
			return sweeps.ErrNoChange
		}
		r.Published, r.Publishing = true, nil
		return nil
	})
	return err
}
