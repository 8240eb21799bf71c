package finalize

import (
	"context"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

// why is what names the cause of a run that is ending other than
// succeeded: its trainer's mark and last step, and what its last
// attempt's evidence holds (read back from the bucket, so that a retried
// delivery names the same cause). A run that is succeeding reads nothing:
// if it ends failed all the same (no checkpoint), its reason names it.
func (h *Handler) why(ctx context.Context, rec *runs.Record, res *checkpoints.Result, evidenceURI string) cause.Input {
	var in cause.Input
	if res != nil && res.Mark != nil {
		in.Mark = &cause.Mark{Status: res.Mark.Status, Error: res.Mark.Error}
	}
	if rec.Progress != nil {
		in.Step = rec.Progress.Step
	}
	if rec.Phase != runs.Finishing || rec.Outcome == runs.OutcomeSucceeded || evidenceURI == "" {
		return in
	}
	bucket, folder, err := evidence.Locate(evidenceURI, rec.Attempt)
	if err == nil {
		err = cause.Gather(ctx, h.Deps.Objects.Bucket(bucket), folder, &in)
	}
	if err != nil {
		// The cause is named from what could be read.
		h.Deps.Log.Warn("evidence_unread", "run_id", rec.RunID, "error", err.Error())
	}
	return in
}
