package provision

import (
	"context"
	"errors"

	"github.com/raydrop/raydrop/pkg/runs"
)

// intake records a new run (REJECTED for a bad spec), announces it, and
// takes the cluster or queues behind its holder; a redelivery carries on
// where an earlier delivery stopped (resume).
func (h *Handler) intake(ctx context.Context, runID, source, defaultName string, data []byte, size int64) error {
	d := h.Deps
	rec, err := d.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		rec := newRecord(runID, source, defaultName, data, size, d.Config, d.Time())
		if rec.Phase == runs.Accepted && rec.Spec.Swept() {
			// A sweep: its own record, and a run per trial.
			return d.AdmitSweep(ctx, rec)
		}
		return d.AdmitNew(ctx, newRecord(runID, source, defaultName, data, size, d.Config, d.Time()))
	}
	if err != nil {
		return err
	}
	return d.Resume(ctx, rec)
}
