package runs

import "fmt"

// Outcome is how a run, or one of its attempts, ended.
type Outcome string

// The outcomes. A run ends succeeded, failed or cancelled, a sweep's trial
// also stopped (early stopping); an attempt also ends retried when the
// next attempt replaced it.
const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomeFailed    Outcome = "failed"
	OutcomeCancelled Outcome = "cancelled"
	OutcomeStopped   Outcome = "stopped"
	OutcomeRetried   Outcome = "retried"
)

// Reason says why a run is where it is, in a form a downstream system can
// act on without parsing the human-readable message beside it (as KubeRay's
// JobFailedReason does). Every failed, cancelled or rejected run has one.
type Reason string

// The reasons; reasons says what each means.
const (
	InvalidSpec           Reason = "InvalidSpec"
	WaitingForCluster     Reason = "WaitingForCluster"
	ReasonCancelled       Reason = "Cancelled"
	DeadlineExceeded      Reason = "DeadlineExceeded"
	StartDeadlineExceeded Reason = "StartDeadlineExceeded"
	ApplicationError      Reason = "ApplicationError"
	InfrastructureFailure Reason = "InfrastructureFailure"
	InvalidJob            Reason = "InvalidJob"
	NoCheckpoint          Reason = "NoCheckpoint"
	CheckpointsUnreadable Reason = "CheckpointsUnreadable"
	Preempted             Reason = "Preempted"
	InvalidData           Reason = "InvalidData"
	InvalidModel          Reason = "InvalidModel"
	DataCheckFailed       Reason = "DataCheckFailed"
	EarlyStopped          Reason = "EarlyStopped"
	Stalled               Reason = "Stalled"
)

var reasons = []struct {
	Reason
	doc string
}{
	{InvalidSpec, "rejected: the job spec is invalid; problems lists every problem"},
	{WaitingForCluster, "queued: another run holds the cluster"},
	{ReasonCancelled, "cancelled: a user asked to cancel the run"},
	{DeadlineExceeded, "failed: an attempt ran longer than limits.deadline"},
	{StartDeadlineExceeded, "failed: an attempt did not start running within limits.startDeadline"},
	{ApplicationError, "failed: the training code failed (the message has its error); a retry cannot fix it"},
	{InfrastructureFailure, "failed: the RayJob was lost or ended without the trainer's completion mark, on every attempt limits.retries allows"},
	{InvalidJob, "failed: the API server or KubeRay refused the RayJob (Invalid, ValidationFailed)"},
	{NoCheckpoint, "failed: the job succeeded but wrote no complete checkpoint"},
	{Preempted, "failed: attempts were lost to preemption (Spot VMs reclaimed, nodes shut down) more often than limits.preemptions allows; on a retried attempt, why it was retried"},
	{InvalidData, "failed: the data check found data the run cannot train on (the message names the file, row and column); no GPU worker was asked for"},
	{InvalidModel, "failed: the data check found a model the trainer cannot fine-tune (not a Gemma 3 vision model; no GPU worker was asked for), or the Hugging Face Hub has no such model revision or refuses the deployment's token for it"},
	{DataCheckFailed, "failed: the data check ended without a verdict (its RayJob failed or was lost), or did not end within limits.startDeadline"},
	{EarlyStopped, "stopped: the sweep's early stopping rule stopped the trial (its held-out loss at a checkpoint trailed the median of the other trials' at the same checkpoint); its checkpoints are kept"},
	{CheckpointsUnreadable, "failed: the pipeline cannot read what the job wrote (its completion mark or checkpoints): no permission on the bucket, or a malformed object"},
	{Stalled, "failed: an attempt stopped making progress (no rank ended a step within its stall window, limits.stallAfter and stallFactor) more often than limits.stallRestarts allows; the ranks' stacks are in the evidence; on a retried attempt, why it was restarted"},
}

// Reasons returns every reason with what it means.
func Reasons() map[Reason]string {
	out := map[Reason]string{}
	for _, r := range reasons {
		out[r.Reason] = r.doc
	}
	return out
}

// Ending is how a run is to end, decided before finalize runs.
type Ending struct {
	Outcome Outcome
	Reason  Reason // empty only for success
	Message string // for people: what happened, with the details
}

// Check refuses an ending that is not one a run can have.
func (e Ending) Check() error {
	switch e.Outcome {
	case OutcomeSucceeded:
		return nil
	case OutcomeFailed, OutcomeCancelled, OutcomeStopped:
		if _, ok := Reasons()[e.Reason]; !ok {
			return fmt.Errorf("a %s run needs a known reason, not %q", e.Outcome, e.Reason)
		}
		return nil
	}
	return fmt.Errorf("outcome %q is not succeeded, failed, cancelled or stopped", e.Outcome)
}
