package monitor

import (
	"errors"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// lostJob is how long a just-created RayJob may be missing from a listing
// before the run counts it as lost.
const lostJob = 2 * time.Minute

// Observation is everything a check decides on, read before it decides.
type Observation struct {
	Run *runs.Record
	// Sweep: the check is part of a tick's sweep, which also drives stalled
	// steps on; a check on a message or a completion mark does not.
	Sweep bool
	// Job is the current attempt's RayJob, nil when there is none (or the
	// sweep's listing did not show it); Mark is the trainer's completion
	// mark of the attempt, nil when it has not written one. Both are read
	// only for a phase with a RayJob (runs.Phase.HasJob).
	Job  *rayv1.RayJob
	Mark *checkpoints.Mark
	// Unreadable says why the mark cannot be read and never will be (no
	// permission on the bucket, or a malformed mark); empty when it can.
	Unreadable string
	// Workers is what the attempt's worker pods show; nil when they were
	// not looked at (a phase without a RayJob).
	Workers *Workers
	// Check is what the data check wrote (data-check.json), nil while it
	// has written nothing; read only for a CHECKING run, whose Job is the
	// check's RayJob.
	Check *checkpoints.DataCheck
	// EarlyStop, for a sweep's running trial, is why its sweep's median
	// rule stops it; "" when it goes on.
	EarlyStop string
	// Cause is the current attempt's cause when its trainer wrote a failed
	// mark (named from its evidence), nil otherwise or when it could not
	// be named.
	Cause *runs.Cause
	// Pulse is what the current attempt's ranks' heartbeats say, nil when
	// none has beaten (or they were not read: a run not RUNNING); Stacks
	// how many ranks have written their stacks to the attempt's evidence,
	// read only once a stall is suspected.
	Pulse  *checkpoints.Pulse
	Stacks int
	Now    time.Time
}

// Action is what a check does about a run.
type Action string

// The actions.
const (
	Wait     Action = "wait"      // nothing to do now (but record Preempted, Waiting)
	NextTier Action = "next-tier" // move the pending workers to the next capacity tier (Why)
	Readmit  Action = "readmit"   // give a waiting run its cluster if the holder is gone (sweep)
	Resend   Action = "resend"    // send a stalled step's message again (sweep)
	Finish   Action = "finish"    // decide the run's end (Ending), deleting the RayJob first when DeleteJob
	Progress Action = "progress"  // record that the attempt runs, and its progress; announce running
	Succeed  Action = "succeed"   // the attempt succeeded: record it running if no check saw it, then finish
	Retry    Action = "retry"     // start the next attempt (Why the current one is given up)
	Checked  Action = "checked"   // the data check passed: record it and start the first attempt
	Stall    Action = "stall"     // record the attempt suspected stalled (Stall) and announce it
)

// Decision is what Decide decided.
type Decision struct {
	Action    Action
	Topic     string // Resend: the key of the step's topic
	Ending    runs.Ending
	DeleteJob bool
	Why       string // Retry, NextTier; Wait: why the workers wait for capacity
	// Pending is the pending worker pods a NextTier replaces.
	Pending []string
	// ServedOn, for a Progress that starts the attempt running or a
	// Succeed of an attempt no check saw running, is the capacity tier its
	// workers run on (-1: as recorded), and Startup how they came up (nil:
	// unknown).
	ServedOn int
	Startup  *runs.Startup
	// Check, for a Finish that ends a data check, is what it found, recorded
	// in the same write.
	Check *checkpoints.DataCheck
	// Preempted is evidence of preemption the attempt's record lacks,
	// recorded before the action; a Retry with any (or with evidence
	// already recorded) counts against limits.preemptions.
	Preempted []string
	// Cause, for a Retry of an attempt whose training code failed, is its
	// cause, recorded on the attempt it retries (RetryPolicy reads it).
	Cause *runs.Cause
	// Stall, for a Stall, is the suspicion; Moved, for a Progress of an
	// attempt suspected stalled, is when a rank moved on since (the
	// suspicion is cleared), zero otherwise.
	Stall *runs.Stall
	Moved time.Time
}

// errUnknownPhase refuses a phase the monitor was not taught.
var errUnknownPhase = errors.New("the monitor does not know this phase")

// Decide is the monitor's judgement of one run: a pure function of what it
// observed, so that every phase and case is tested without I/O (decide_test.go).
func Decide(o Observation) (Decision, error) {
	r := o.Run
	stale := o.Now.Sub(r.UpdatedAt) > runs.StaleStep
	switch r.Phase {
	case runs.Accepted, runs.Queued:
		switch {
		case r.CancelRequested:
			return cancel("cancelled while waiting for the cluster", false), nil
		case o.Sweep:
			return Decision{Action: Readmit}, nil
		}
	case runs.Provisioned:
		switch {
		case r.CancelRequested:
			return cancel("cancelled before the job started", false), nil
		case o.Sweep && stale:
			return Decision{Action: Resend, Topic: wiring.TopicProvisioned}, nil
		}
	case runs.Checking:
		return decideCheck(o), nil
	case runs.Submitted, runs.Running:
		return decideJob(o)
	case runs.Finishing:
		if o.Sweep && stale {
			return Decision{Action: Resend, Topic: wiring.TopicFinished}, nil
		}
	case runs.Succeeded, runs.Failed, runs.Cancelled, runs.Rejected, runs.Stopped:
		// The sweep lists an ended run only while it is unannounced: the
		// delivery that ended it died before its event went out. Finalize
		// finishes what it left.
		if o.Sweep && stale && r.Unannounced() {
			return Decision{Action: Resend, Topic: wiring.TopicFinished}, nil
		}
	default:
		return Decision{}, fmt.Errorf("run %s is in phase %q: %w", r.RunID, r.Phase, errUnknownPhase)
	}
	return Decision{Action: Wait}, nil
}

// decideJob judges a run whose attempt has a RayJob: cancellation and
// deadlines first, then the trainer's completion mark, then what KubeRay
// says of the job.
func decideJob(o Observation) (Decision, error) {
	r := o.Run
	a := r.CurrentAttempt()
	if a == nil || r.Spec == nil {
		return Decision{}, fmt.Errorf("run %s is %s without an attempt or a spec", r.RunID, r.Phase)
	}
	lim := r.Spec.Limits
	switch {
	case r.CancelRequested:
		return cancel("cancelled by request", true), nil
	case o.Now.Sub(a.CreatedAt) > time.Duration(lim.Deadline):
		return fail(runs.DeadlineExceeded, true, "deadline exceeded: the attempt ran longer than limits.deadline %s", time.Duration(lim.Deadline)), nil
	case a.RunningAt == nil && o.Now.Sub(a.CreatedAt) > time.Duration(lim.StartDeadline):
		return fail(runs.StartDeadlineExceeded, true, "start deadline exceeded: the job did not start running within limits.startDeadline %s", time.Duration(lim.StartDeadline)), nil
	}
	if o.Unreadable != "" {
		// The pipeline could never tell how the job ended: free its GPUs.
		return fail(runs.CheckpointsUnreadable, true, "cannot read the trainer's completion mark: %s", o.Unreadable), nil
	}
	evidence := newEvidence(a, o)
	if o.Mark != nil {
		switch o.Mark.Status {
		case "succeeded":
			return succeed(o, a), nil
		case checkpoints.MarkPreempted:
			// The trainer saved a checkpoint on the node's notice and left.
			return withEvidence(retryOrFail(r, "the trainer checkpointed on a preemption notice and stopped", true), evidence), nil
		}
		// A node reclaimed under the attempt fails the training code too:
		// a worker dies before the step it was on ends (GKE gives a Spot
		// VM's pods 15 of its 30 seconds' notice, Autopilot Spot Pods at
		// most 25 s), or during the save on notice. The driver writes a
		// failed mark then, which is a preemption when a notice reached
		// the attempt or its pods show their nodes went away.
		switch {
		case o.Mark.NoticeSeen:
			return withEvidence(retryOrFail(r, "training failed after a preemption notice: "+firstLine(o.Mark.Error), true), evidence), nil
		case preempted(a, evidence):
			return withEvidence(retryOrFail(r, "training failed after its nodes were reclaimed: "+firstLine(o.Mark.Error), true), evidence), nil
		}
		// The training code failed: retried only where its cause says a
		// retry can help (RetryPolicy).
		return withEvidence(afterFailure(r, o.Cause, firstLine(o.Mark.Error)), evidence), nil
	}
	if o.EarlyStop != "" {
		// Its checkpoints are kept; it ends STOPPED, not as a failure.
		return Decision{Action: Finish, DeleteJob: true, Ending: runs.Ending{Outcome: runs.OutcomeStopped, Reason: runs.EarlyStopped, Message: "stopped early: " + o.EarlyStop}}, nil
	}
	if d, ok := actOnStall(o, a); ok {
		return withEvidence(d, evidence), nil
	}
	jobName := names.RayJob(r.RunID, r.Attempt)
	if o.Job == nil {
		if r.Phase == runs.Submitted && o.Now.Sub(r.UpdatedAt) < lostJob {
			return Decision{Action: Wait}, nil // just created; a list may not show it yet
		}
		return withEvidence(retryOrFail(r, "RayJob "+jobName+" disappeared", preempted(a, evidence)), evidence), nil
	}
	st := o.Job.Status
	validation := st.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed
	if rayv1.IsJobDeploymentTerminal(st.JobDeploymentStatus) || validation {
		if st.JobDeploymentStatus == rayv1.JobDeploymentStatusComplete && st.JobStatus == rayv1.JobStatusSucceeded {
			return succeed(o, a), nil
		}
		why := fmt.Sprintf("RayJob %s ended %s/%s", jobName, st.JobDeploymentStatus, st.JobStatus)
		if st.Reason != "" || st.Message != "" {
			why += fmt.Sprintf(" (%s: %s)", st.Reason, firstLine(st.Message))
		}
		if validation {
			return fail(runs.InvalidJob, false, "%s", why), nil
		}
		// The job ended without the trainer's mark: the trainer did not get
		// to write it, so the cause is outside the training code.
		return withEvidence(retryOrFail(r, why, preempted(a, evidence)), evidence), nil
	}
	if w := o.Workers; a.RunningAt == nil && w != nil && w.Running < w.Need {
		return withEvidence(capacity(o, a), evidence), nil
	}
	if st.JobStatus == rayv1.JobStatusRunning {
		if s := suspectStall(o, a); s != nil {
			return withEvidence(Decision{Action: Stall, Stall: s}, evidence), nil
		}
		return withEvidence(started(o, a, Decision{Action: Progress, Moved: movedOn(o, a)}), evidence), nil
	}
	return withEvidence(Decision{Action: Wait}, evidence), nil
}

// succeed is the Succeed of the attempt. One no check saw running (a short
// job) is recorded as having run on the tier its workers show: a tier move
// whose record write was lost (the monitor died between the RayCluster's
// update and the record's) would otherwise leave the attempt on the tier
// it left, and price it there.
func succeed(o Observation, a *runs.Attempt) Decision {
	return started(o, a, Decision{Action: Succeed})
}
