package runs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Phase is where a run is. Every phase, what it means and the transitions
// between phases are declared here and nowhere else; the Mark… methods
// below are the only code that changes a record's phase. Phases move
// forward, except that a retry takes a SUBMITTED or RUNNING run back to
// PROVISIONED for its next attempt; a terminal phase never changes.
type Phase string

// The phases of a run.
const (
	Accepted    Phase = "ACCEPTED"    // spec valid, record created
	Rejected    Phase = "REJECTED"    // spec invalid: terminal
	Queued      Phase = "QUEUED"      // waiting for the cluster another run holds
	Checking    Phase = "CHECKING"    // the data check runs on the Ray head; no GPU worker is asked for
	Provisioned Phase = "PROVISIONED" // cluster ensured, RayJob not yet created
	Submitted   Phase = "SUBMITTED"   // RayJob created
	Running     Phase = "RUNNING"     // Ray job running
	Finishing   Phase = "FINISHING"   // the run's end is decided (Ending); finalize pending
	Succeeded   Phase = "SUCCEEDED"
	Failed      Phase = "FAILED"
	Cancelled   Phase = "CANCELLED"
	Stopped     Phase = "STOPPED" // a sweep's trial its early stopping rule ended: not a failure
)

// phaseInfo is what the pipeline knows about a phase.
type phaseInfo struct {
	// event: the phase has a public event, dev.raydrop.run.v1.<lower-case phase>.
	event bool
	// terminal: the run has ended; nothing changes its phase again.
	terminal bool
	// job: the current attempt's RayJob exists or is being made, so the
	// monitor watches it.
	job bool
}

// phases lists every phase in the order a run meets them (a rejected run
// meets only REJECTED; a run ends in one of the last four, STOPPED only a
// sweep's trial).
var phases = []struct {
	Phase
	phaseInfo
}{
	{Accepted, phaseInfo{event: true}},
	{Rejected, phaseInfo{event: true, terminal: true}},
	{Queued, phaseInfo{event: true}},
	{Checking, phaseInfo{event: true}},
	{Provisioned, phaseInfo{}},
	{Submitted, phaseInfo{job: true}},
	{Running, phaseInfo{event: true, job: true}},
	{Finishing, phaseInfo{}},
	{Succeeded, phaseInfo{event: true, terminal: true}},
	{Failed, phaseInfo{event: true, terminal: true}},
	{Cancelled, phaseInfo{event: true, terminal: true}},
	{Stopped, phaseInfo{event: true, terminal: true}},
}

// Phases returns every phase, in the order a run meets them.
func Phases() []Phase {
	out := make([]Phase, len(phases))
	for i, p := range phases {
		out[i] = p.Phase
	}
	return out
}

func (p Phase) info() (phaseInfo, bool) {
	for _, q := range phases {
		if q.Phase == p {
			return q.phaseInfo, true
		}
	}
	return phaseInfo{}, false
}

// Known reports whether p is a phase of the lifecycle.
func (p Phase) Known() bool { _, ok := p.info(); return ok }

// Terminal reports whether the run has ended.
func (p Phase) Terminal() bool { i, _ := p.info(); return i.terminal }

// Active reports whether the run holds, or waits for, cluster resources.
func (p Phase) Active() bool { return p.Known() && !p.Terminal() }

// HasJob reports whether the run's current attempt has a RayJob to watch.
func (p Phase) HasJob() bool { i, _ := p.info(); return i.job }

// ReportReady is not a phase: a run never enters it. It names the
// announcement of the run's report (dev.raydrop.run.v1.report_ready),
// which follows the terminal event once the report is written, in
// Published and Publishing, so that the claim-and-announce machinery that
// announces each phase once announces the report once too.
const ReportReady Phase = "REPORT_READY"

// StallSuspected is not a phase either: it names the announcement that
// the current attempt is suspected stalled (dev.raydrop.run.v1.stalled),
// made once per attempt: a new attempt forgets the last one's
// (MarkProvisioned).
const StallSuspected Phase = "STALLED"

// Event is the name of the phase's public event (the last part of its
// CloudEvent type), or "" for a phase that has none; report_ready for
// ReportReady.
func (p Phase) Event() string {
	if i, _ := p.info(); i.event || p == ReportReady || p == StallSuspected {
		return strings.ToLower(string(p))
	}
	return ""
}

// PhaseOfEvent is the phase whose public event is named event.
func PhaseOfEvent(event string) (Phase, bool) {
	p := Phase(strings.ToUpper(event))
	return p, p.Event() == event && event != ""
}

// Transition is a change of phase. Each has the phases it may start from
// (transitions) and one Mark… method that makes it and records what it
// records.
type Transition string

// The transitions. A record is created ACCEPTED or REJECTED (NewRecord).
const (
	ToQueued      Transition = "queue"     // MarkQueued: the cluster is held by another run
	ToChecking    Transition = "check"     // MarkChecking: the data check's RayJob was created
	ToProvisioned Transition = "provision" // MarkProvisioned: an attempt starts (the first, or a retry)
	ToSubmitted   Transition = "submit"    // MarkSubmitted: its RayJob was created
	ToRunning     Transition = "run"       // MarkRunning: its Ray job runs
	ToFinishing   Transition = "finish"    // MarkFinishing: the run's end is decided
	ToEnded       Transition = "end"       // MarkEnded: finalize found the results
)

// transitions holds, for each transition, the phases it may start from.
var transitions = map[Transition][]Phase{
	ToQueued:      {Accepted},
	ToChecking:    {Accepted, Queued},
	ToProvisioned: {Accepted, Queued, Checking, Submitted, Running},
	ToSubmitted:   {Provisioned},
	ToRunning:     {Submitted},
	ToFinishing:   {Accepted, Queued, Checking, Provisioned, Submitted, Running},
	ToEnded:       {Finishing},
}

// Transitions returns every transition with the phases it may start from.
func Transitions() map[Transition][]Phase {
	out := map[Transition][]Phase{}
	for t, from := range transitions {
		out[t] = slices.Clone(from)
	}
	return out
}

// TransitionError refuses a transition the record's phase does not allow,
// or one a delivery has already made (a duplicate). It is an ErrNoChange,
// so returned from a Store.Update function it leaves the record as is.
type TransitionError struct {
	Transition Transition
	From       Phase
	Why        string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("run cannot %s from %s: %s", e.Transition, e.From, e.Why)
}

// Is makes every TransitionError an ErrNoChange.
func (e *TransitionError) Is(target error) bool { return target == ErrNoChange }

// IsRefused reports whether err refused a transition.
func IsRefused(err error) bool {
	var te *TransitionError
	return errors.As(err, &te)
}

func (r *Record) allow(t Transition) error {
	if !slices.Contains(transitions[t], r.Phase) {
		return &TransitionError{Transition: t, From: r.Phase, Why: fmt.Sprintf("allowed only from %v", transitions[t])}
	}
	return nil
}

// allowFor is allow for a step of one attempt, which must be the current
// one: a step of an older attempt is stale.
func (r *Record) allowFor(t Transition, attempt int) error {
	if err := r.allow(t); err != nil {
		return err
	}
	if r.Attempt != attempt {
		return r.refuse(t, "attempt %d is not the current attempt %d", attempt, r.Attempt)
	}
	return nil
}

func (r *Record) refuse(t Transition, why string, args ...any) error {
	return &TransitionError{Transition: t, From: r.Phase, Why: fmt.Sprintf(why, args...)}
}

// enter moves the record to phase p at now. Times keeps the first time the
// run entered each phase; History keeps every entry, so the time a retry
// spends in a phase is counted (Durations).
func (r *Record) enter(p Phase, now time.Time) {
	r.Phase = p
	if r.Times == nil {
		r.Times = map[Phase]time.Time{}
	}
	if _, ok := r.Times[p]; !ok {
		r.Times[p] = now
	}
	r.History = append(r.History, Entry{Phase: p, At: now, Attempt: r.Attempt})
}

// NewRecord is a new run's record: ACCEPTED with its spec, or REJECTED with
// the problems that make its spec invalid (then s is nil).
func NewRecord(runID, source, name string, s *spec.JobSpec, problems spec.Problems, now time.Time) *Record {
	r := &Record{APIVersion: spec.APIVersion, RunID: runID, Name: name, Source: source}
	if s == nil {
		if len(problems) == 0 {
			problems = spec.Problems{{Path: "$", Message: "the spec could not be read"}}
		}
		r.Problems = problems
		r.Reason, r.Message = InvalidSpec, fmt.Sprintf("invalid job spec: %d problem(s); first: %s", len(problems), problems[0])
		r.Outcome = OutcomeFailed
		r.enter(Rejected, now)
		return r
	}
	if s.Name == "" {
		s.Name = name
	}
	r.Spec, r.SpecHash, r.Name = s, s.Hash(), s.Name
	r.Cluster, r.Namespace = s.Cluster.Name, s.Cluster.Namespace
	r.enter(Accepted, now)
	return r
}

// UseImages gives the run's Ray containers the deployment's trainer image
// (trainerImage, by digest; "" for a deployment without one) where the
// spec names no image, and records it as the run's TrainerImage when both
// the head and the workers run it. It is done once, at admission: a run
// keeps the image it was admitted with, through every retry, whatever the
// deployment's image later becomes. Without a trainer image an unnamed
// image stays empty: the stock Ray image (spec.Cluster.HeadImage).
func (r *Record) UseImages(trainerImage string) {
	if r.Spec == nil || trainerImage == "" {
		return
	}
	c := &r.Spec.Cluster
	if c.Head.Image == "" {
		c.Head.Image = trainerImage
	}
	if c.Workers.Image == "" {
		c.Workers.Image = trainerImage
	}
	if c.Head.Image == trainerImage && c.Workers.Image == trainerImage {
		r.TrainerImage = trainerImage
	}
}

// MarkQueued records that the run waits for its cluster, held by holder.
func (r *Record) MarkQueued(holder string, now time.Time) error {
	if err := r.allow(ToQueued); err != nil {
		return err
	}
	r.Reason, r.Message = WaitingForCluster, "waiting for cluster "+r.Cluster+" held by run "+holder
	r.enter(Queued, now)
	return nil
}

// MarkChecking records that the data check runs (its RayJob, on the Ray
// head, with the worker group at zero): the run has its cluster, and no GPU
// worker is asked for until the check passes.
func (r *Record) MarkChecking(rayJob string, now time.Time) error {
	if err := r.allow(ToChecking); err != nil {
		return err
	}
	r.Check = &DataCheck{RayJob: rayJob, CreatedAt: now}
	r.Reason, r.Message = "", ""
	r.enter(Checking, now)
	return nil
}

// NoteCheck records the data check's verdict and figures; false when the
// record has them already.
func (r *Record) NoteCheck(found *checkpoints.DataCheck, now time.Time) bool {
	if r.Check == nil || r.Check.EndedAt != nil || found == nil {
		return false
	}
	r.Check.EndedAt, r.Check.Result = &now, found
	return true
}

// MarkProvisioned starts attempt next.N with the cluster up: the first
// attempt of an accepted or queued run, or the retry of a submitted or
// running one (next.N is the current attempt + 1), whose current attempt
// then ends "retried" with why.
func (r *Record) MarkProvisioned(next Attempt, why string, now time.Time) error {
	if err := r.allow(ToProvisioned); err != nil {
		return err
	}
	first := r.Phase == Accepted || r.Phase == Queued || r.Phase == Checking
	switch {
	case first && next.N != 1:
		return r.refuse(ToProvisioned, "attempt %d cannot be a run's first", next.N)
	case !first && next.N != r.Attempt+1:
		return r.refuse(ToProvisioned, "attempt %d does not follow attempt %d", next.N, r.Attempt)
	}
	if prev := r.CurrentAttempt(); prev != nil && prev.EndedAt == nil {
		reason := InfrastructureFailure
		if len(prev.Preemptions) > 0 {
			reason = Preempted
		}
		prev.EndedAt, prev.Outcome, prev.Reason, prev.Message, prev.Waiting = &now, OutcomeRetried, reason, why, ""
	}
	next.CreatedAt = now
	r.Attempt = next.N
	r.Attempts = append(r.Attempts, next)
	// A stall is announced once per attempt, while it is the current one.
	r.Published = slices.DeleteFunc(r.Published, func(p Phase) bool { return p == StallSuspected })
	delete(r.Publishing, StallSuspected)
	r.Reason, r.Message = "", ""
	r.enter(Provisioned, now)
	return nil
}

// MarkSubmitted records that attempt's RayJob was created.
func (r *Record) MarkSubmitted(attempt int, now time.Time) error {
	if err := r.allowFor(ToSubmitted, attempt); err != nil {
		return err
	}
	r.enter(Submitted, now)
	return nil
}

// MarkRunning records that attempt's Ray job runs.
func (r *Record) MarkRunning(attempt int, now time.Time) error {
	if err := r.allowFor(ToRunning, attempt); err != nil {
		return err
	}
	if a := r.CurrentAttempt(); a != nil && a.RunningAt == nil {
		a.RunningAt, a.Waiting = &now, ""
	}
	r.enter(Running, now)
	return nil
}

// NoteStarted records, for attempt not yet recorded running, the capacity
// tier its workers run on (tier < 0: as recorded) and how they came up
// (nil: unknown); true when the record changed. Call it before
// MarkRunning, in the same write.
func (r *Record) NoteStarted(attempt, tier int, s *Startup) bool {
	a := r.open(attempt)
	if a == nil || a.RunningAt != nil {
		return false
	}
	changed := false
	if tier >= 0 && a.Tier != tier {
		a.Tier, changed = tier, true
	}
	if s != nil && a.Startup == nil {
		a.Startup, changed = s, true
	}
	return changed
}

// NoteFirstReport records when the trainer first reported in attempt, and
// its own account of its start (nil when it gave none), once; true when the
// record changed.
func (r *Record) NoteFirstReport(attempt int, at *time.Time, trainer *checkpoints.TrainerStartup) bool {
	a := r.open(attempt)
	if a == nil || at == nil || a.FirstReportAt != nil {
		return false
	}
	t := *at
	a.FirstReportAt = &t
	if trainer.Valid() {
		su := *trainer
		a.TrainerStartup = &su
	}
	return true
}

// open is attempt when it is the current attempt and has not ended, else
// nil.
func (r *Record) open(attempt int) *Attempt {
	a := r.CurrentAttempt()
	if a == nil || r.Attempt != attempt || a.EndedAt != nil {
		return nil
	}
	return a
}

// MoveTier records that attempt's workers are asked on capacity tier tier
// from now, having waited for the last one because of why.
func (r *Record) MoveTier(attempt, tier int, why string, now time.Time) error {
	a := r.open(attempt)
	if a == nil || a.RunningAt != nil || tier != a.Tier+1 {
		return ErrNoChange
	}
	a.Tier, a.TierSince, a.Waiting = tier, &now, why
	return nil
}

// NoteWaiting records why attempt's workers are pending; false when the
// record already says so (or the attempt no longer waits).
func (r *Record) NoteWaiting(attempt int, why string) bool {
	a := r.open(attempt)
	if a == nil || a.RunningAt != nil || a.Waiting == why {
		return false
	}
	a.Waiting = why
	return true
}

// NotePreemptions adds what shows attempt's nodes were reclaimed, each
// once; false when it adds nothing.
func (r *Record) NotePreemptions(attempt int, seen []string) bool {
	a := r.open(attempt)
	if a == nil {
		return false
	}
	added := false
	for _, s := range seen {
		if !slices.Contains(a.Preemptions, s) {
			a.Preemptions = append(a.Preemptions, s)
			added = true
		}
	}
	return added
}

// MarkFinishing decides how the run ends, while its attempt (0 for a run
// that never had one) is current; only the first decision counts.
func (r *Record) MarkFinishing(attempt int, e Ending, now time.Time) error {
	if err := r.allowFor(ToFinishing, attempt); err != nil {
		return err
	}
	if err := e.Check(); err != nil {
		return err
	}
	r.Outcome, r.Reason, r.Message = e.Outcome, e.Reason, e.Message
	if a := r.CurrentAttempt(); a != nil && a.EndedAt == nil {
		a.EndedAt, a.Outcome, a.Reason, a.Message = &now, e.Outcome, e.Reason, e.Message
	}
	r.enter(Finishing, now)
	return nil
}

// MarkEnded ends a finishing run with what finalize found: SUCCEEDED,
// FAILED or CANCELLED as decided, except that a run that succeeded without
// a complete checkpoint fails (NoCheckpoint), and one whose results cannot
// be read (unreadable says why) fails CheckpointsUnreadable: the run ends
// either way, so its cluster is released.
func (r *Record) MarkEnded(res *checkpoints.Result, unreadable error, now time.Time) error {
	if err := r.allow(ToEnded); err != nil {
		return err
	}
	p, ok := map[Outcome]Phase{OutcomeSucceeded: Succeeded, OutcomeFailed: Failed, OutcomeCancelled: Cancelled, OutcomeStopped: Stopped}[r.Outcome]
	if !ok {
		return r.refuse(ToEnded, "outcome %q is not one the run can end with", r.Outcome)
	}
	switch {
	case unreadable != nil && p != Cancelled:
		p, r.Outcome = Failed, OutcomeFailed
		r.Reason, r.Message = CheckpointsUnreadable, "cannot read the run's results: "+unreadable.Error()
	case p == Succeeded && (res == nil || res.Latest == nil):
		p, r.Outcome = Failed, OutcomeFailed
		r.Reason, r.Message = NoCheckpoint, "the job succeeded but wrote no complete checkpoint (adapter files missing)"
	}
	r.Result = res
	r.enter(p, now)
	return nil
}

// ErrCancelNotNeeded refuses a cancellation of a run that has ended or
// whose cancellation is already requested.
var ErrCancelNotNeeded = fmt.Errorf("%w: the run has ended or its cancellation is already requested", ErrNoChange)

// MarkCancelRequested records a request to cancel the run; the monitor
// acts on it. A run that has ended cannot be cancelled.
func (r *Record) MarkCancelRequested() error {
	if r.CancelRequested || r.Phase.Terminal() {
		return ErrCancelNotNeeded
	}
	r.CancelRequested = true
	return nil
}

// Entry is one entry of the run into a phase.
type Entry struct {
	Phase   Phase     `json:"phase"`
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt,omitempty"`
}

// Durations is the time the run spent in each phase it went through up to
// end, summed over every entry (a retry enters PROVISIONED again), for
// every phase but the terminal one.
func (r *Record) Durations(end time.Time) map[Phase]time.Duration {
	h := r.History
	if len(h) == 0 { // a record written before History was kept
		for p, t := range r.Times {
			h = append(h, Entry{Phase: p, At: t})
		}
		slices.SortStableFunc(h, func(a, b Entry) int { return a.At.Compare(b.At) })
	}
	out := map[Phase]time.Duration{}
	for i, e := range h {
		next := end
		if i+1 < len(h) {
			next = h[i+1].At
		}
		if !e.Phase.Terminal() {
			out[e.Phase] += next.Sub(e.At)
		}
	}
	return out
}
