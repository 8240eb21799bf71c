// Package finalize is the Finalize function: on a finished message it
// discovers every checkpoint the run wrote (Ray Train's layout in the
// bucket), writes the terminal record, hands the cluster to the next queued
// run or scales its workers to zero, and publishes the terminal CloudEvent;
// then it renders the run's report and announces it with an event of its
// own (report_ready), so that the terminal event never waits for the
// report. Running it twice publishes nothing new.
package finalize

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Handler handles finished messages.
type Handler struct{ Deps *pipeline.Deps }

// Handle finalizes the run the message names.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	d := h.Deps
	if e.Type() == pipeline.PubSubPublished {
		if step, err := pipeline.DecodeStep(e); err == nil && step.SweepID != "" {
			return h.sweep(ctx, step.SweepID, "")
		}
	}
	step, rec, err := d.StepRun(ctx, e)
	if err != nil {
		return err
	}
	if rec.Phase != runs.Finishing && !rec.Unannounced() {
		d.Log.Info("duplicate_ignored", "run_id", rec.RunID, "phase", rec.Phase)
		return nil
	}
	// What the pods can tell, before any of them goes.
	evidenceURI := rec.Evidence
	if evidenceURI == "" {
		evidenceURI = d.KeepEvidence(ctx, rec, rec.Attempt)
	}
	if rec.Trial != nil && rec.Phase == runs.Finishing {
		// The sweep's next trial queues on this trial's cluster before it
		// is released, so the cluster is handed over with its workers up.
		if err := h.sweep(ctx, rec.Trial.SweepID, rec.RunID); err != nil {
			return err
		}
	}
	// The cluster first: the job is over, so the next run need not wait
	// for the results to be read. Then the record (unless an earlier
	// delivery ended the run and died before announcing it: the sweep
	// sends such runs here again), the events, then the report and its
	// own event: until both events have gone out the run is listed as
	// unannounced and comes back here, so a delivery that dies anywhere in
	// between leaves nothing undone.
	head, err := h.release(ctx, rec)
	if err != nil {
		return err
	}
	rec, owed, held, claimedAt, err := h.conclude(ctx, rec, step.Published, evidenceURI, head)
	if err != nil {
		return err
	}
	// The events of earlier phases are recorded published before the
	// terminal one goes out, so that a delivery dying after publishing them
	// leaves no copy of them to follow the terminal event.
	early := slices.DeleteFunc(slices.Clone(owed), runs.Phase.Terminal)
	if len(early) > 0 && len(early) < len(owed) {
		if rec, err = d.PublishClaimed(ctx, rec, early, claimedAt); err != nil {
			return err
		}
		owed = owed[len(early):]
	}
	if rec, err = d.PublishClaimed(ctx, rec, owed, claimedAt); err != nil {
		return err
	}
	if held {
		// Another delivery is publishing one of the run's events: try
		// again later, in case it dies before it has.
		return fmt.Errorf("run %s: another delivery is announcing one of its events", rec.RunID)
	}
	if err := h.report(ctx, rec); err != nil {
		return err
	}
	if rec.Trial != nil {
		// The sweep notes how the trial ended, and ends once its last has.
		return h.sweep(ctx, rec.Trial.SweepID, "")
	}
	return nil
}

// conclude writes the run's terminal record, with the checkpoints it
// discovers and its evidence folder, if an earlier delivery has not; in
// the same write it records the events the finished message says were
// published, and claims those
// the run still owes (pipeline.ClaimOwed), which Handle publishes once the
// cluster is released. Results it cannot read (no permission on the
// bucket, a malformed object) end the run FAILED all the same, so its
// cluster is released.
func (h *Handler) conclude(ctx context.Context, rec *runs.Record, published []runs.Phase, evidenceURI, head string) (_ *runs.Record, owed []runs.Phase, held bool, now time.Time, _ error) {
	var res *checkpoints.Result
	var unreadable error
	if rec.Phase == runs.Finishing {
		var err error
		res, err = h.discover(ctx, rec)
		if gcp.Unreadable(err) {
			unreadable = err
		} else if err != nil {
			return nil, nil, false, now, err
		}
	}
	why := h.why(ctx, rec, res, evidenceURI)
	now = h.Deps.Time()
	ended := false
	rec, err := h.Deps.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		owed, held, ended = nil, false, false
		changed := pipeline.RecordPublished(r, published)
		if evidenceURI != "" && r.Evidence == "" {
			r.Evidence, changed = evidenceURI, true
		}
		if r.Phase == runs.Finishing && res != nil {
			if err := r.MarkEnded(res, unreadable, now); err != nil {
				return err
			}
			ended = true
			if head != "" && r.Phase == runs.Failed && r.HeadKept == nil {
				r.HeadKept = &runs.HeadKept{Pod: head, Until: now.Add(time.Duration(r.Spec.Debug.KeepFailedFor))}
			}
			if r.Phase != runs.Succeeded {
				// Named from the run's final reason and what it left.
				in := why
				in.Reason, in.Message = r.Reason, r.Message
				c := cause.Classify(in)
				r.Cause = &c
			}
		}
		if !r.Phase.Terminal() {
			return pipeline.Permanent(fmt.Errorf("run %s is %s: it has not ended", r.RunID, r.Phase))
		}
		owed, held = pipeline.ClaimOwed(r, now)
		if !changed && !ended && len(owed) == 0 {
			return runs.ErrNoChange
		}
		return nil
	})
	if err != nil {
		return nil, nil, false, now, err
	}
	if ended {
		attrs := []any{"run_id", rec.RunID, "phase", rec.Phase, "reason", rec.Reason, "message", rec.Message, "checkpoints", len(rec.Result.Checkpoints)}
		if c := rec.Cause; c != nil {
			attrs = append(attrs, "cause", c.Kind, "summary", c.Summary)
		}
		h.Deps.Log.Info("run_ended", attrs...)
	}
	return rec, owed, held, now, nil
}

// discover finds the checkpoints of every attempt of the run. When they
// cannot be read (gcp.Unreadable), it returns what it found before
// with the error.
func (h *Handler) discover(ctx context.Context, rec *runs.Record) (*checkpoints.Result, error) {
	res := &checkpoints.Result{Checkpoints: []checkpoints.Checkpoint{}}
	for n := 1; n <= rec.Attempt && rec.Spec != nil; n++ {
		bucket, exp := manifests.Experiment(rec.Spec, rec.RunID, n)
		r, err := checkpoints.Discover(ctx, h.Deps.Objects.Bucket(bucket), exp)
		if err != nil {
			return res, err
		}
		merge(res, r)
	}
	return res, nil
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
	// A later attempt's best wins a tie on no metric at all.
	if r.Best != nil && (into.Best == nil || checkpoints.Better(r.Best, into.Best) || checkpoints.RankedBy(into.Best) == "") {
		into.Best, into.BestBy = r.Best, checkpoints.RankedBy(r.Best)
	}
	if r.FinalMetrics != nil {
		into.FinalMetrics = r.FinalMetrics
	}
	if r.Trial != "" {
		into.Trial = r.Trial
	}
	into.Mark = r.Mark
}
