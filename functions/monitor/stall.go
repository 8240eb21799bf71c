package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Stall detection. Every rank's heartbeat (checkpoints.Beat) says when it
// last ended a step or began something between two steps (an evaluation,
// a save, the sample answers). An attempt whose ranks have all been still
// for longer than its window, max(limits.stallAfter, limits.stallFactor x
// the median step time), is suspected stalled: a rank stuck in a
// collective, a read that never returns, a data loader's deadlock, or a
// rank that died while the others wait for it. The clock starts at the
// attempt's first step, so that loading the model and compiling never
// count; a stall before it is left to limits.startDeadline and deadline.

// stallWindow is how long an attempt's ranks may be still: stallAfter, or
// stallFactor median steps when that is longer.
func stallWindow(r *runs.Record, stepTime time.Duration) time.Duration {
	lim := r.Spec.Limits
	return max(time.Duration(lim.StallAfter), time.Duration(lim.StallFactor*float64(stepTime)))
}

// suspectStall is the suspicion to record and announce about the running
// attempt a, nil when there is none to record: the ranks moved within the
// window, they have not ended a first step, they all ended training, or
// the suspicion is recorded and announced already.
func suspectStall(o Observation, a *runs.Attempt) *runs.Stall {
	p := o.Pulse
	if p == nil || p.FirstStep.IsZero() || a.RunningAt == nil || p.Doing == "ended" {
		return nil
	}
	window := stallWindow(o.Run, p.StepTime)
	if o.Now.Sub(p.Moved) <= window {
		return nil
	}
	if s := a.Stall; s != nil && s.ClearedAt == nil && o.Run.WasPublished(runs.StallSuspected) {
		return nil
	}
	return &runs.Stall{SuspectedAt: o.Now, Step: p.Step, Since: p.Moved, Window: window,
		StepTime: p.StepTime, Doing: p.Doing, Behind: p.Behind}
}

// StacksGrace is how long the monitor waits, after it asked, for every
// rank's stacks before it acts on a stall without them: two of the
// heartbeat's 30 s beats and the writes (a rank whose heartbeat thread is
// stopped too, by a main thread holding the GIL, never answers).
const StacksGrace = 90 * time.Second

// actOnStall is what to do about attempt a, suspected stalled and
// announced, once every rank's stacks are in (or StacksGrace has passed,
// or its RayJob is gone): restart it from its latest checkpoint while
// limits.stallRestarts allows, else fail the run Stalled. ok is false
// while there is nothing to do yet, or no stall to act on: a job that
// ended on its own is judged by how it ended.
func actOnStall(o Observation, a *runs.Attempt) (Decision, bool) {
	r, s := o.Run, a.Stall
	if s == nil || s.ClearedAt != nil || !r.WasPublished(runs.StallSuspected) || !movedOn(o, a).IsZero() {
		return Decision{}, false
	}
	if o.Job != nil && (rayv1.IsJobDeploymentTerminal(o.Job.Status.JobDeploymentStatus) || o.Job.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed) {
		return Decision{}, false
	}
	ranks := 0
	if o.Pulse != nil {
		ranks = o.Pulse.Ranks
	}
	if o.Job != nil && (ranks == 0 || o.Stacks < ranks) && o.Now.Sub(s.SuspectedAt) < StacksGrace {
		return Decision{Action: Wait}, true // the stacks first
	}
	c := &runs.Cause{Kind: string(runs.Stalled), Summary: "training stopped advancing: " + s.Summary(), Rank: -1, Step: s.Step}
	lim := r.Spec.Limits
	if n := r.StallRestarts(); n < lim.StallRestarts {
		return Decision{Action: Retry, DeleteJob: true, Cause: c, Why: fmt.Sprintf("stalled: %s; restart %d of limits.stallRestarts %d", s.Summary(), n+1, lim.StallRestarts)}, true
	}
	return fail(runs.Stalled, true, "stalled: %s; %d restarts already (limits.stallRestarts %d)", s.Summary(), r.StallRestarts(), lim.StallRestarts), true
}

// movedOn is when a rank of attempt a, suspected stalled, moved on after
// the suspicion's last sign of progress; zero when a is not suspected or
// none has.
func movedOn(o Observation, a *runs.Attempt) time.Time {
	if s := a.Stall; s != nil && s.ClearedAt == nil && o.Pulse != nil && o.Pulse.Moved.After(s.Since) {
		return o.Pulse.Moved
	}
	return time.Time{}
}

// pulse reads the running attempt's heartbeats. One that cannot be read
// now leaves the judgement to the next check: a stall is judged over
// minutes, and a read that fails says nothing of the ranks.
func (h *Handler) pulse(ctx context.Context, rec *runs.Record, files attemptFiles) *checkpoints.Pulse {
	if rec.Phase != runs.Running {
		return nil
	}
	beats, bad, err := checkpoints.ReadBeats(ctx, files.store, files.exp)
	if err != nil {
		h.Deps.Log.Warn("heartbeats_unread", "run_id", rec.RunID, "attempt", rec.Attempt, "error", err.Error())
		return nil
	}
	if len(bad) > 0 {
		h.Deps.Log.Warn("heartbeats_malformed", "run_id", rec.RunID, "attempt", rec.Attempt, "objects", bad)
	}
	p, ok := checkpoints.PulseOf(beats)
	if !ok {
		return nil
	}
	return &p
}

// stall asks every rank for its stacks, then records and announces the
// suspicion that the attempt stalled. The request is one object per
// attempt, created once: a redelivery, or a later suspicion, finds it
// there (each rank also writes its stacks unasked when its own step
// stalls).
func (h *Handler) stall(ctx context.Context, rec *runs.Record, s *runs.Stall) error {
	h.Deps.Log.Warn("attempt_stalled", "run_id", rec.RunID, "attempt", rec.Attempt, "step", s.Step,
		"since", s.Since, "window", s.Window.String(), "doing", s.Doing, "behind", s.Behind)
	bucket, exp := manifests.Experiment(rec.Spec, rec.RunID, rec.Attempt)
	ask, err := json.Marshal(checkpoints.StacksAsk{ID: fmt.Sprintf("attempt-%d", rec.Attempt), Why: s.Summary(), At: s.SuspectedAt})
	if err != nil {
		return err
	}
	name := checkpoints.StacksRequestName(exp)
	if err := h.Deps.Objects.Create(ctx, bucket, name, ask, "application/json"); err != nil && !errors.Is(err, gcp.ErrExists) {
		return fmt.Errorf("ask for the ranks' stacks at gs://%s/%s: %w", bucket, name, err)
	}
	_, err = h.Deps.NoteStall(ctx, rec.RunID, rec.Attempt, *s)
	return err
}

// stacks is how many ranks have written their stacks to the current
// attempt's evidence folder, counted only once a stall is suspected (0
// when none, or the folder cannot be listed now: the grace then decides).
func (h *Handler) stacks(ctx context.Context, rec *runs.Record) int {
	a := rec.CurrentAttempt()
	if a == nil || a.Stall == nil || a.Stall.ClearedAt != nil {
		return 0
	}
	bucket, folder, ok := strings.Cut(strings.TrimPrefix(manifests.EvidenceFolder(rec.Spec, rec.RunID, rec.Attempt), "gs://"), "/")
	if !ok {
		return 0
	}
	names, err := h.Deps.Objects.Bucket(bucket).List(ctx, folder+checkpoints.StacksDir+"/")
	if err != nil {
		h.Deps.Log.Warn("stacks_unlisted", "run_id", rec.RunID, "attempt", rec.Attempt, "error", err.Error())
		return 0
	}
	return len(names)
}
