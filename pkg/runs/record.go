// Package runs holds the run record, runs/<id>/status.json in the intake
// bucket: the single source of truth of a run's phase. It is created once
// (DoesNotExist) and advanced only by compare-and-swap on its generation, so
// concurrent and duplicate deliveries never lose or double an update.
package runs

import (
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Phase is where a run is. Phases move forward (see Rank), except that a
// retry takes a SUBMITTED or RUNNING run back to PROVISIONED for its next
// attempt; a terminal phase never changes.
type Phase string

// The phases of a run.
const (
	Accepted    Phase = "ACCEPTED"    // spec valid, record created
	Rejected    Phase = "REJECTED"    // spec invalid: terminal
	Queued      Phase = "QUEUED"      // waiting for the cluster another run holds
	Provisioned Phase = "PROVISIONED" // cluster ensured, RayJob not yet created
	Submitted   Phase = "SUBMITTED"   // RayJob created
	Running     Phase = "RUNNING"     // Ray job running
	Finishing   Phase = "FINISHING"   // RayJob ended (or was stopped); finalize pending
	Succeeded   Phase = "SUCCEEDED"
	Failed      Phase = "FAILED"
	Cancelled   Phase = "CANCELLED"
)

// Rank orders phases; a message for a phase below the record's is stale.
func (p Phase) Rank() int {
	switch p {
	case Accepted:
		return 1
	case Queued:
		return 2
	case Provisioned:
		return 3
	case Submitted:
		return 4
	case Running:
		return 5
	case Finishing:
		return 6
	case Succeeded, Failed, Cancelled, Rejected:
		return 7
	}
	return 0
}

// Terminal reports whether the run has ended.
func (p Phase) Terminal() bool { return p.Rank() == 7 }

// Active reports whether the run holds, or waits for, cluster resources.
func (p Phase) Active() bool { return p.Rank() >= 1 && p.Rank() < 7 }

// Record is a run's status document.
type Record struct {
	APIVersion string `json:"apiVersion"`
	RunID      string `json:"runId"`
	Name       string `json:"name"`
	Source     string `json:"source"`
	SpecHash   string `json:"specHash,omitempty"`

	Phase    Phase          `json:"phase"`
	Reason   string         `json:"reason,omitempty"`
	Problems []spec.Problem `json:"problems,omitempty"`

	Spec      *spec.JobSpec `json:"spec,omitempty"`
	Cluster   string        `json:"cluster,omitempty"`
	Namespace string        `json:"namespace,omitempty"`

	Attempt  int       `json:"attempt"`
	Attempts []Attempt `json:"attempts,omitempty"`

	Progress        *Progress `json:"progress,omitempty"`
	CancelRequested bool      `json:"cancelRequested,omitempty"`

	// Outcome is how the run ended, recorded (with Reason) before finalize
	// runs: succeeded, failed or cancelled; a deadline, an infrastructure
	// failure after the retries and a failed training are all failed, told
	// apart by Reason.
	Outcome string `json:"outcome,omitempty"`

	Result *checkpoints.Result `json:"result,omitempty"`

	// Published lists the phases whose public event has gone out, so a
	// redelivered message publishes nothing new.
	Published []Phase `json:"published,omitempty"`
	// Publishing holds, per phase, when a delivery claimed the right to
	// publish its event; a fresh claim keeps concurrent deliveries from
	// publishing it twice, a stale one (its claimer died) lets another try.
	Publishing map[Phase]time.Time `json:"publishing,omitempty"`

	// Times records when the run entered each phase.
	Times     map[Phase]time.Time `json:"times"`
	CreatedAt time.Time           `json:"createdAt"`
	UpdatedAt time.Time           `json:"updatedAt"`
}

// Attempt is one RayJob of the run.
type Attempt struct {
	N          int        `json:"n"`
	RayJob     string     `json:"rayJob"`
	ResumeFrom string     `json:"resumeFrom,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	RunningAt  *time.Time `json:"runningAt,omitempty"`
	EndedAt    *time.Time `json:"endedAt,omitempty"`
	Outcome    string     `json:"outcome,omitempty"`
	Reason     string     `json:"reason,omitempty"`
}

// Progress is the training progress read from Ray Train's result.json.
type Progress struct {
	Step       int64     `json:"step"`
	TotalSteps int64     `json:"totalSteps,omitempty"`
	Epoch      float64   `json:"epoch"`
	Loss       *float64  `json:"loss,omitempty"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// Enter moves the record to phase p at time now, keeping the first time it
// entered each phase.
func (r *Record) Enter(p Phase, now time.Time) {
	r.Phase = p
	if r.Times == nil {
		r.Times = map[Phase]time.Time{}
	}
	if _, ok := r.Times[p]; !ok {
		r.Times[p] = now
	}
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

// Unannounced reports whether the run has ended but its terminal event has
// not gone out yet: the delivery that ended it died before announcing it, so
// the sweep keeps sending the run to finalize until it is announced.
func (r *Record) Unannounced() bool { return r.Phase.Terminal() && !r.WasPublished(r.Phase) }

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
