package monitor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

func cancel(msg string, deleteJob bool) Decision {
	return Decision{Action: Finish, DeleteJob: deleteJob, Ending: runs.Ending{Outcome: runs.OutcomeCancelled, Reason: runs.ReasonCancelled, Message: msg}}
}

func fail(reason runs.Reason, deleteJob bool, format string, args ...any) Decision {
	return Decision{Action: Finish, DeleteJob: deleteJob, Ending: runs.Ending{Outcome: runs.OutcomeFailed, Reason: reason, Message: fmt.Sprintf(format, args...)}}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}

// resend sends a stalled step's message again. It first touches the record
// (its UpdatedAt), so the step counts as stale again only a full StaleStep
// later: however often ticks come, a stalled step is resent once per
// StaleStep, never in a storm that buries the message behind its copies.
// The same write claims the events the stalled delivery did not publish.
func (h *Handler) resend(ctx context.Context, rec *runs.Record, topic string) error {
	phase, attempt := rec.Phase, rec.Attempt
	if _, err := h.Deps.Advance(ctx, rec.RunID, func(r *runs.Record) error {
		if r.Phase != phase || r.Attempt != attempt {
			return errMoved
		}
		return nil
	}); errors.Is(err, errMoved) {
		return nil // the step went on meanwhile
	} else if err != nil {
		return err
	}
	h.Deps.Log.Warn("step_resent", "run_id", rec.RunID, "phase", phase, "topic", topic)
	return h.Deps.Send(ctx, h.Deps.Config.Topics.Name(topic), pipeline.Step{RunID: rec.RunID, Attempt: attempt})
}

// errMoved says a record left the phase a resend was for.
var errMoved = errors.New("the run moved on")
