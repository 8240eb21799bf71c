package pipeline

import (
	"context"
	"fmt"

	"github.com/raydrop/raydrop/pkg/runs"
)

// NoteStall records that attempt is suspected stalled (s) and announces it
// (dev.raydrop.run.v1.stalled) once: the record and the event's claim in
// one write, then the event, then the record of it published. A suspicion
// already recorded is kept (its first sight is when the stall began to
// show); its event, if a delivery died before it went out, goes out now.
// Nothing changes once the attempt is no longer the run's current one, or
// the run has left the phases with a running job.
func (d *Deps) NoteStall(ctx context.Context, runID string, attempt int, s runs.Stall) (*runs.Record, error) {
	now := d.Time()
	claimed := false
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		claimed = false
		a := r.CurrentAttempt()
		if r.Attempt != attempt || a == nil || !r.Phase.HasJob() || a.EndedAt != nil {
			return runs.ErrNoChange
		}
		changed := a.Stall == nil || a.Stall.ClearedAt != nil
		if changed {
			a.Stall = &s
		}
		claimed = claim(r, runs.StallSuspected, now)
		if !claimed && !changed {
			return runs.ErrNoChange
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("note the stall of attempt %d: %w", attempt, err)
	}
	if claimed {
		return d.PublishClaimed(ctx, rec, []runs.Phase{runs.StallSuspected}, now)
	}
	return rec, nil
}
