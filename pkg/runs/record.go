// Package runs holds the run record, runs/<id>/status.json in the state
// bucket: the single source of truth of a run's phase. It is created once
// (DoesNotExist) and advanced only by compare-and-swap on its generation, so
// concurrent and duplicate deliveries never lose or double an update.
//
// The run's lifecycle lives here too (lifecycle.go): every phase, every
// transition with the phases it may start from, and the Mark… methods that
// are the only code changing a record's phase.
package runs

import (
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Record is a run's status document.
type Record struct {
	APIVersion string `json:"apiVersion"`
	RunID      string `json:"runId"`
	Name       string `json:"name"`
	Source     string `json:"source"`
	SpecHash   string `json:"specHash,omitempty"`

	Phase Phase `json:"phase"`
	// Reason says why the run is where it is (set while queued, and for a
	// run that ended other than succeeded); Message says it for people.
	Reason   Reason         `json:"reason,omitempty"`
	Message  string         `json:"message,omitempty"`
	Problems []spec.Problem `json:"problems,omitempty"`
	// Cause is why a failed or cancelled run ended, named from what it
	// left (pkg/cause), once finalize has concluded it.
	Cause *Cause `json:"cause,omitempty"`

	Spec *spec.JobSpec `json:"spec,omitempty"`
	// TrainerImage is the deployment's trainer image (by digest) when the
	// head and the workers both run it (UseImages): its dependencies are
	// installed, so the run's runtime env installs nothing.
	TrainerImage string `json:"trainerImage,omitempty"`
	// Model is the base model's revision, pinned by commit at the first
	// attempt, and where it is staged, when the deployment stages models
	// (RAYDROP_MODEL_STAGING); nil: the workers load it from the Hub.
	Model *Model `json:"model,omitempty"`
	// Trial is the sweep the run is a trial of, nil for a run of its own.
	Trial     *TrialOf `json:"trial,omitempty"`
	Cluster   string   `json:"cluster,omitempty"`
	Namespace string   `json:"namespace,omitempty"`

	Attempt  int       `json:"attempt"`
	Attempts []Attempt `json:"attempts,omitempty"`
	// Check is the data check, for a spec that asks for one
	// (dataset.check): it runs before the first attempt.
	Check *DataCheck `json:"check,omitempty"`

	Progress        *Progress `json:"progress,omitempty"`
	CancelRequested bool      `json:"cancelRequested,omitempty"`

	// Outcome is how the run ends, decided (with Reason) when it enters
	// FINISHING, before finalize runs.
	Outcome Outcome `json:"outcome,omitempty"`
	// HeadKept is the Ray head pod of a failed run kept for a look
	// (debug.keepFailedFor): the cluster is not passed on until then.
	HeadKept *HeadKept `json:"headKept,omitempty"`

	Result *checkpoints.Result `json:"result,omitempty"`
	// Report is the gs:// URI of the run's report page, once written: after
	// the terminal event, which does not wait for it; its own event
	// (ReportReady) follows.
	Report string `json:"report,omitempty"`
	// NoReport says why the run has no report and will have none (the
	// function may not write the run's bucket): no report_ready event
	// follows the terminal one.
	NoReport string `json:"noReport,omitempty"`
	// Evidence is the gs:// URI of the run's evidence folder
	// (pkg/evidence: its pods' logs, statuses and events, kept before its
	// workers were scaled down), once the last attempt's was captured.
	Evidence string `json:"evidence,omitempty"`

	// Published lists the phases whose public event has gone out, so a
	// redelivered message publishes nothing new.
	Published []Phase `json:"published,omitempty"`
	// Publishing holds, per phase, when a delivery claimed the right to
	// publish its event; a fresh claim keeps concurrent deliveries from
	// publishing it twice, a stale one (its claimer died) lets another try.
	Publishing map[Phase]time.Time `json:"publishing,omitempty"`

	// Times records when the run first entered each phase; History every
	// entry, in order.
	Times     map[Phase]time.Time `json:"times"`
	History   []Entry             `json:"history,omitempty"`
	CreatedAt time.Time           `json:"createdAt"`
	UpdatedAt time.Time           `json:"updatedAt"`
}

// TrialOf names the sweep a run is a trial of: its ID, the trial's
// number, and the values of the sweep's parameters in its spec.
type TrialOf struct {
	SweepID string            `json:"sweepId"`
	Index   int               `json:"index"`
	Params  []spec.ParamValue `json:"params"`
}

// DataCheck is the run's data check: trainer/datacheck.py in a RayJob on
// the Ray head, before any GPU worker is asked for.
type DataCheck struct {
	RayJob    string     `json:"rayJob"`
	CreatedAt time.Time  `json:"createdAt"`
	EndedAt   *time.Time `json:"endedAt,omitempty"`
	// Result is what the check found (data-check.json): its verdict, rows,
	// rows left out and why, token lengths, images, steps and estimate.
	Result *checkpoints.DataCheck `json:"result,omitempty"`
}

// Attempt is one RayJob of the run.
type Attempt struct {
	N          int        `json:"n"`
	RayJob     string     `json:"rayJob"`
	ResumeFrom string     `json:"resumeFrom,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	RunningAt  *time.Time `json:"runningAt,omitempty"`
	EndedAt    *time.Time `json:"endedAt,omitempty"`
	Outcome    Outcome    `json:"outcome,omitempty"`
	Reason     Reason     `json:"reason,omitempty"`
	Message    string     `json:"message,omitempty"`
	// Cause is why a retried attempt's training code failed (pkg/cause),
	// which the retry policy reads; nil for one that ended otherwise.
	Cause *Cause `json:"cause,omitempty"`
	// Tier is the capacity tier (an index into the spec's Tiers) the
	// workers are asked on, from TierSince (nil: from CreatedAt). An
	// attempt runs once every worker it needs runs: RunningAt minus
	// CreatedAt is how long it waited for capacity.
	Tier      int        `json:"tier"`
	TierSince *time.Time `json:"tierSince,omitempty"`
	// Waiting is why the workers are pending, as the scheduler says, while
	// the attempt waits for capacity.
	Waiting string `json:"waiting,omitempty"`
	// Preemptions is what showed the attempt's nodes were reclaimed: a
	// worker pod's disruption ("pod: reason"), or the trainer's checkpoint
	// on notice. An attempt with any ends Preempted, not against retries.
	Preemptions []string `json:"preemptions,omitempty"`
	// Startup is how the attempt's workers came up, read from their pods
	// when the monitor first saw them all running; nil before, or for an
	// attempt recorded before it was kept.
	Startup *Startup `json:"startup,omitempty"`
	// FirstReportAt is when the trainer made its first report of the
	// attempt (its first logged optimizer step), as Ray timed it.
	FirstReportAt *time.Time `json:"firstReportAt,omitempty"`
	// TrainerStartup is the trainer's own account of its start, from the
	// same first report; nil when it gave none.
	TrainerStartup *checkpoints.TrainerStartup `json:"trainerStartup,omitempty"`
	// Stall is the monitor's suspicion that the attempt stopped making
	// progress; nil while it has none.
	Stall *Stall `json:"stall,omitempty"`
}

// Stall is a suspected stall of an attempt: no rank ended a step (or began
// an evaluation or a save) for longer than Window, from Since, read in the
// ranks' heartbeats (checkpoints.Beat).
type Stall struct {
	SuspectedAt time.Time     `json:"suspectedAt"`
	Step        int64         `json:"step"`  // the last step any rank ended
	Since       time.Time     `json:"since"` // the last sign of progress
	Window      time.Duration `json:"window"`
	// StepTime is the median step time the window was judged with (0: not
	// known yet); Doing what the ranks said they did last; Behind the
	// ranks whose last step is before Step.
	StepTime time.Duration `json:"stepTime,omitempty"`
	Doing    string        `json:"doing,omitempty"`
	Behind   []int         `json:"behind,omitempty"`
	// ClearedAt is when a rank moved on after the suspicion: it was a slow
	// stretch, not a stall.
	ClearedAt *time.Time `json:"clearedAt,omitempty"`
}

// Summary says the stall in one line.
func (s *Stall) Summary() string {
	msg := fmt.Sprintf("no progress since step %d ended at %s, %s without a step (window %s", s.Step,
		s.Since.UTC().Format(time.TimeOnly), s.SuspectedAt.Sub(s.Since).Round(time.Second), s.Window)
	if s.StepTime > 0 {
		msg += fmt.Sprintf(", median step %s", s.StepTime.Round(time.Millisecond))
	}
	msg += ")"
	if s.Doing != "" && s.Doing != "training" {
		msg += "; the ranks were " + s.Doing
	}
	if len(s.Behind) > 0 {
		msg += fmt.Sprintf("; ranks behind: %v", s.Behind)
	}
	return msg
}

// Startup is when an attempt's worker pods came up, as their status says:
// ScheduledAt, when the last of them was bound to a node (its PodScheduled
// condition turned true: GKE had created or found a GPU node for it), and
// StartedAt, when the last one's containers started (its image pulled and
// its container created). Workers kept from an earlier attempt or run came
// up before the attempt was created: its start-up then took no time.
type Startup struct {
	ScheduledAt time.Time `json:"scheduledAt"`
	StartedAt   time.Time `json:"startedAt"`
}

// StartupParts are the seconds an attempt's workers took to come up, from
// the attempt's creation: waiting for nodes, then the image pull and
// container start, then (once the trainer has reported) Ray's runtime env,
// the weights, the data and the steps before its first report.
type StartupParts struct {
	Nodes, Image float64
	FirstStep    *float64
	// Trainer splits FirstStep by the trainer's own account, when it gave
	// one: FirstStep is then their sum, to the end of its first optimizer
	// step rather than its first report.
	Trainer *TrainerParts
}

// TrainerParts are the seconds from the workers' containers' start to the
// end of the trainer's first optimizer step: RuntimeEnv until its train
// function began (Ray's runtime env, the worker processes), Weights
// getting and loading the base model (its staging by the driver included),
// Data the processor and rows, Steps the rest (the model's adapters, the
// first step).
type TrainerParts struct {
	RuntimeEnv, Weights, Data, Steps float64
}

// Total is the seconds of the parts known.
func (p StartupParts) Total() float64 {
	t := p.Nodes + p.Image
	if p.FirstStep != nil {
		t += *p.FirstStep
	}
	return t
}

// StartupParts splits the attempt's start-up, each part at least 0 (workers
// kept from an earlier attempt or run came up before it); ok is false before
// the monitor saw its workers come up.
func (a *Attempt) StartupParts() (p StartupParts, ok bool) {
	s := a.Startup
	if s == nil {
		return p, false
	}
	p.Nodes = max(s.ScheduledAt.Sub(a.CreatedAt).Seconds(), 0)
	p.Image = max(s.StartedAt.Sub(a.CreatedAt).Seconds()-p.Nodes, 0)
	up := s.StartedAt
	if up.Before(a.CreatedAt) {
		up = a.CreatedAt
	}
	if su := a.TrainerStartup; su.Valid() {
		unix := func(t float64) time.Time { return time.Unix(0, int64(t*1e9)) }
		// The driver's staging of the model came before the train function
		// began: it counts as weights, not as Ray's runtime env.
		before := max(unix(su.StartedAt).Sub(up).Seconds(), 0)
		stage := min(su.StageSeconds, before)
		t := &TrainerParts{RuntimeEnv: before - stage, Weights: stage + su.WeightsSeconds, Data: su.DataSeconds}
		t.Steps = max(unix(su.FirstStepAt).Sub(up).Seconds()-t.RuntimeEnv-t.Weights-t.Data, 0)
		f := t.RuntimeEnv + t.Weights + t.Data + t.Steps
		p.FirstStep, p.Trainer = &f, t
	} else if a.FirstReportAt != nil {
		f := max(a.FirstReportAt.Sub(up).Seconds(), 0)
		p.FirstStep = &f
	}
	return p, true
}

// Text is the parts for people: "2m27s: nodes 2m1s, image 26s, to the
// first step 40s".
func (p StartupParts) Text() string {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Second) }
	s := fmt.Sprintf("%s: nodes %s, image %s", sec(p.Total()), sec(p.Nodes), sec(p.Image))
	if p.FirstStep != nil {
		s += fmt.Sprintf(", to the first step %s", sec(*p.FirstStep))
	}
	if t := p.Trainer; t != nil {
		s += fmt.Sprintf(" (runtime env %s, weights %s, data %s, first step %s)", sec(t.RuntimeEnv), sec(t.Weights), sec(t.Data), sec(t.Steps))
	}
	return s
}

// Since is when the attempt moved to its tier.
func (a *Attempt) Since() time.Time {
	if a.TierSince != nil {
		return *a.TierSince
	}
	return a.CreatedAt
}

// Lost counts the run's attempts retried after a failure outside the
// training code (against limits.retries) and those lost to preemption
// (against limits.preemptions), the current one included once ended.
func (r *Record) Lost() (retried, preempted int) {
	for _, a := range r.Attempts {
		switch {
		case a.Outcome != OutcomeRetried, a.Reason == Stalled:
		case a.Reason == Preempted:
			preempted++
		default:
			retried++
		}
	}
	return retried, preempted
}

// StallRestarts is how many attempts were restarted as stalled (against
// limits.stallRestarts; Lost counts none of them).
func (r *Record) StallRestarts() int {
	n := 0
	for _, a := range r.Attempts {
		if a.Outcome == OutcomeRetried && a.Reason == Stalled {
			n++
		}
	}
	return n
}

// Cause is why a run ended other than succeeded, as pkg/cause names it
// from the run's reason, its trainer's mark and its evidence.
type Cause struct {
	Kind    string `json:"kind"` // one of cause.Kinds
	Summary string `json:"summary"`
	Hint    string `json:"hint,omitempty"`
	// Rank is the failing rank where the lines name it (-1: not known);
	// Pod the pod that held it or showed the cause; Step the last step
	// the attempt reported before it (0: none).
	Rank int    `json:"rank"`
	Pod  string `json:"pod,omitempty"`
	Step int64  `json:"step,omitempty"`
	// Lines are the lines that show it, Source where they were read (a
	// path in the attempt's evidence folder).
	Lines  []string `json:"lines,omitempty"`
	Source string   `json:"source,omitempty"`
}

// Progress is the training progress read from Ray Train's result.json.
type Progress struct {
	Step       int64     `json:"step"`
	TotalSteps int64     `json:"totalSteps,omitempty"`
	Epoch      float64   `json:"epoch"`
	Loss       *float64  `json:"loss,omitempty"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// WasPublished reports whether the event of phase p has gone out.
func (r *Record) WasPublished(p Phase) bool {
	for _, q := range r.Published {
		if q == p {
			return true
		}
	}
	return false
}

// MarkPublished records that the event of phase p has gone out.
func (r *Record) MarkPublished(p Phase) {
	if !r.WasPublished(p) {
		r.Published = append(r.Published, p)
	}
}

// Unannounced reports whether the run has ended but finalize has not
// finished announcing it: its terminal event has not gone out, or its
// report has not been written and announced (ReportOwed). The delivery that
// ended it died before it was done, so the sweep keeps sending the run to
// finalize until it is.
func (r *Record) Unannounced() bool {
	return r.Phase.Terminal() && (!r.WasPublished(r.Phase) || r.ReportOwed())
}

// ReportOwed reports whether the run has ended and its report has yet to be
// written or announced: every run with a spec gets one (a run rejected at
// intake has none), unless it cannot be written for good (NoReport).
func (r *Record) ReportOwed() bool {
	return r.Phase.Terminal() && r.Spec != nil && r.NoReport == "" && !r.WasPublished(ReportReady)
}

// CurrentAttempt returns the record's current attempt, or nil before the
// first RayJob.
func (r *Record) CurrentAttempt() *Attempt {
	for i := range r.Attempts {
		if r.Attempts[i].N == r.Attempt {
			return &r.Attempts[i]
		}
	}
	return nil
}

// Model is a run's base model: the revision the spec asked for, the commit
// the Hub resolved it to (every attempt trains from that commit), and the
// staged copy in the deployment's bucket the workers read (weights).
type Model struct {
	Repo     string `json:"repo"`
	Revision string `json:"revision"`
	Commit   string `json:"commit"`
	// URI is the staged copy's folder, gs://<bucket>/<prefix>/<repo>/<commit>.
	URI string `json:"uri"`
	// StagedBy is the run that staged the copy, or stages it now; Staged:
	// the copy was complete when this run's attempt was submitted.
	StagedBy string `json:"stagedBy"`
	Staged   bool   `json:"staged"`
}

// HeadKept is a failed run's Ray head pod, kept for a look until Until;
// ReleasedAt is when the monitor deleted it and passed the cluster on.
type HeadKept struct {
	Pod        string     `json:"pod"`
	Until      time.Time  `json:"until"`
	ReleasedAt *time.Time `json:"releasedAt,omitempty"`
}

// KeepsHead reports whether the run keeps its head pod (and its cluster)
// for a look at now: a failed run whose spec asks for it (debug.
// keepFailedFor), until its time is up. A run still ending (FINISHING) to
// fail keeps it from its end on.
func (r *Record) KeepsHead(now time.Time) bool {
	if r.Spec == nil || r.Spec.Debug.KeepFailedFor <= 0 || r.Cluster == "" || r.Attempt < 1 {
		return false
	}
	if h := r.HeadKept; h != nil {
		return h.ReleasedAt == nil && now.Before(h.Until)
	}
	if t, ok := r.Times[Failed]; ok && r.Phase == Failed {
		return now.Before(t.Add(time.Duration(r.Spec.Debug.KeepFailedFor)))
	}
	return r.Phase == Finishing && r.Outcome == OutcomeFailed
}
