package monitor

import (
	"context"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

// retryRule is whether a retry can help an attempt whose training code
// failed with a cause.
type retryRule int

const (
	// never: a retry would fail the same way.
	never retryRule = iota
	// notSameStepTwice: retried (within limits.retries) unless an earlier
	// attempt failed with the same cause at the same step: memory that ran
	// short once may have been a moment's fragmentation or a neighbour,
	// twice at the same step it is the run's own need.
	notSameStepTwice
	// once: retried once in the run (within limits.retries).
	once
	// withinRetries: retried within limits.retries (the retry resumes on
	// the nodes the workers get then).
	withinRetries
)

// RetryPolicy is the one table of which failures of the training code
// are retried (docs/pipeline.md, "Retries by cause"). A cause it does
// not name is never retried; an attempt that ended without the trainer's
// mark, or was preempted, follows limits.retries and limits.preemptions
// as before.
var RetryPolicy = map[cause.Kind]retryRule{
	cause.PythonException: never,
	cause.DataError:       never,
	cause.Unknown:         never,
	cause.CudaOutOfMemory: notSameStepTwice,
	cause.OOMKilled:       notSameStepTwice,
	cause.HostOutOfMemory: notSameStepTwice,
	cause.NcclTimeout:     once,
	cause.NcclError:       withinRetries,
	cause.GpuError:        withinRetries,
}

// afterFailure decides on an attempt whose trainer wrote a failed mark
// (and that no preemption explains): retried when RetryPolicy says a retry
// can help and the spec allows one, else the run fails. c is the
// attempt's cause, nil when it could not be named.
func afterFailure(r *runs.Record, c *runs.Cause, errLine string) Decision {
	if c == nil {
		return fail(runs.ApplicationError, false, "training failed: %s", errLine)
	}
	kind := cause.Kind(c.Kind)
	why := fmt.Sprintf("training failed: %s (%s: %s)", errLine, kind, c.Summary)
	var d Decision
	switch RetryPolicy[kind] {
	case never:
		return fail(runs.ApplicationError, false, "training failed: %s", errLine)
	case notSameStepTwice:
		if prev := earlier(r, kind, func(p *runs.Cause) bool { return p.Step == c.Step }); prev != 0 {
			at := ""
			if c.Step > 0 {
				at = fmt.Sprintf(" after step %d", c.Step)
			}
			return fail(runs.ApplicationError, false, "training failed: %s (%s%s twice: attempt %d and this one; a retry would fail the same way)", errLine, kind, at, prev)
		}
		d = retryOrFail(r, why, false)
	case once:
		if prev := earlier(r, kind, nil); prev != 0 {
			return fail(runs.InfrastructureFailure, false, "training failed: %s (%s again: attempt %d had it too, and it is retried once)", errLine, kind, prev)
		}
		d = retryOrFail(r, why, false)
	case withinRetries:
		d = retryOrFail(r, why, false)
	}
	if d.Action == Retry {
		d.Cause = c
	}
	return d
}

// earlier is the first earlier attempt of r that failed with kind (and
// same, when given), or 0.
func earlier(r *runs.Record, kind cause.Kind, same func(*runs.Cause) bool) int {
	for _, a := range r.Attempts {
		if a.N < r.Attempt && a.Cause != nil && cause.Kind(a.Cause.Kind) == kind && (same == nil || same(a.Cause)) {
			return a.N
		}
	}
	return 0
}

// evidenceWait is how long a check whose capture of the evidence failed
// waits for another delivery's before it names the cause.
const evidenceWait = 10 * time.Second

// causeOf names the cause of the current attempt, whose trainer wrote a
// failed mark: the evidence is kept first (the capture is done once; the
// teardown that follows finds it), then read back and classified. The
// step it failed after is the last one its metrics tell, read now: the
// recorded progress is only as recent as the last check, and the retry
// policy compares this step with an earlier attempt's.
func (h *Handler) causeOf(ctx context.Context, rec *runs.Record, mark *checkpoints.Mark, files attemptFiles) *runs.Cause {
	if p, _ := h.latest(ctx, rec, files); newer(p, rec.Progress) {
		r := *rec
		r.Progress = p
		rec = &r
	}
	uri := h.Deps.KeepEvidence(ctx, rec, rec.Attempt)
	if uri == "" {
		// Never named from the mark alone when there may be more to read:
		// that could call a failure a retry would pass final.
		uri = h.Deps.AwaitEvidence(ctx, rec, rec.Attempt, evidenceWait)
	}
	c := cause.Classify(h.Deps.CauseInput(ctx, rec, mark, uri))
	h.Deps.Log.Info("attempt_cause", "run_id", rec.RunID, "attempt", rec.Attempt, "cause", c.Kind, "summary", c.Summary)
	return &c
}

// retryOrFail retries an attempt lost to the infrastructure when the spec
// allows another: a preempted one against limits.preemptions, any other
// against limits.retries. Else the run fails.
func retryOrFail(r *runs.Record, why string, preempted bool) Decision {
	retried, lost := r.Lost()
	lim := r.Spec.Limits
	switch {
	case preempted && lost < lim.Preemptions:
		return Decision{Action: Retry, Why: "preempted: " + why}
	case preempted:
		return fail(runs.Preempted, false, "preempted: %s; %d attempts lost to preemption already (limits.preemptions %d)", why, lost, lim.Preemptions)
	case retried < lim.Retries:
		return Decision{Action: Retry, Why: why}
	}
	if r.Attempt > 1 {
		why = fmt.Sprintf("%s; no retries left after %d attempts", why, r.Attempt)
	}
	return fail(runs.InfrastructureFailure, false, "%s", why)
}
