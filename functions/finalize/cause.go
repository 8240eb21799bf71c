package finalize

import (
	"context"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

// why is what names the cause of a run that is ending other than
// succeeded: its trainer's mark and last step, and what its last
// attempt's evidence holds. A run that is succeeding reads no evidence:
// if it ends failed all the same (no checkpoint), its reason names it.
func (h *Handler) why(ctx context.Context, rec *runs.Record, res *checkpoints.Result, evidenceURI string) cause.Input {
	var mark *checkpoints.Mark
	if res != nil {
		mark = res.Mark
	}
	if rec.Phase != runs.Finishing || rec.Outcome == runs.OutcomeSucceeded {
		evidenceURI = ""
	}
	return h.Deps.CauseInput(ctx, rec, mark, evidenceURI)
}
