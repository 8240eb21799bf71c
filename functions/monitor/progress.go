package monitor

import (
	"context"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

// progress records that the attempt runs (on the capacity tier and with
// the start-up d says), with its latest step, epoch and loss, and announces
// the running phase once.
func (h *Handler) progress(ctx context.Context, rec *runs.Record, files attemptFiles, d Decision) error {
	p, first := h.latest(ctx, rec, files)
	if rec.Phase == runs.Running && !newer(p, rec.Progress) && rec.WasPublished(runs.Running) && d.Moved.IsZero() {
		return nil // nothing new since the record was read: no second read, no write
	}
	// The move to RUNNING and the claim of its event are one write.
	attempt := rec.Attempt
	_, err := h.Deps.Advance(ctx, rec.RunID, func(r *runs.Record) error {
		if r.Attempt != attempt {
			return runs.ErrNoChange
		}
		r.NoteStarted(attempt, d.ServedOn, d.Startup)
		r.NoteFirstReport(attempt, first.at, first.startup)
		moved := r.MarkRunning(attempt, h.Deps.Time()) == nil
		cleared := clearStall(r.CurrentAttempt(), d.Moved)
		if r.Phase != runs.Running || !moved && !cleared && !newer(p, r.Progress) {
			return runs.ErrNoChange
		}
		if newer(p, r.Progress) {
			r.Progress = p
		}
		return nil
	})
	return err
}

// latest is the attempt's progress as its last metrics tell, and when its
// trainer first reported (both nil before it has).
func (h *Handler) latest(ctx context.Context, rec *runs.Record, files attemptFiles) (*runs.Progress, firstReport) {
	res, err := checkpoints.Discover(ctx, files.store, files.exp)
	if err != nil || res.LastMetrics == nil {
		return nil, firstReport{}
	}
	m := res.LastMetrics
	p := &runs.Progress{Step: int64(m["step"]), Epoch: m["epoch"], UpdatedAt: h.Deps.Time()}
	if l, ok := m["loss"]; ok {
		p.Loss = &l
	}
	if max := rec.Spec.Training.MaxSteps; max > 0 {
		p.TotalSteps = int64(max)
	}
	return p, firstReport{res.FirstReportAt, res.TrainerStartup}
}

// firstReport is when the trainer first reported, and its account of its
// start then.
type firstReport struct {
	at      *time.Time
	startup *checkpoints.TrainerStartup
}

// newer reports whether p tells more than the recorded progress.
func newer(p, recorded *runs.Progress) bool {
	return p != nil && (recorded == nil || recorded.Step != p.Step || recorded.Epoch != p.Epoch)
}

// clearStall clears the stall suspected of attempt a when a rank moved on
// (at moved) after its last sign of progress; false when there was none to
// clear.
func clearStall(a *runs.Attempt, moved time.Time) bool {
	if a == nil || a.Stall == nil || a.Stall.ClearedAt != nil || moved.IsZero() || !moved.After(a.Stall.Since) {
		return false
	}
	a.Stall.ClearedAt = &moved
	return true
}
