package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// A Start is a step that brings a run's workers to work, ready to be
// recorded: the data check (Attempt manifests.CheckAttempt, on the head
// with the worker group at zero), a run's first attempt, or a retry
// resuming from ResumeFrom. Prepare brings the cluster up as it needs;
// Mark records it in the run's record; once that is written, SendStart
// sends the provisioned message on which Submit creates its RayJob. Every
// way a step starts goes through these three: StartAttempt for a record
// that exists, Provision's admission for the record it is about to create.
type Start struct {
	Attempt    int
	RayJob     string
	ResumeFrom string
	Why        string // for a retry: why the attempt before it ended
	// PrevCause, for a retry of an attempt whose training code failed, is
	// that attempt's cause, recorded on it in the same write.
	PrevCause *runs.Cause
}

// Check reports whether the start is the data check's.
func (s Start) Check() bool { return s.Attempt == manifests.CheckAttempt }

// FirstAttempt is the step a run that has its cluster starts with: the
// data check when its spec asks for one, else attempt 1.
func FirstAttempt(rec *runs.Record) int {
	if rec.Spec != nil && rec.Spec.Dataset.Check {
		return manifests.CheckAttempt
	}
	return 1
}

// Prepare brings the run's trainer ConfigMap and RayCluster up for attempt
// n: the worker group scaled to the spec's replicas, or kept at zero for
// the data check. It is safe to repeat.
func (d *Deps) Prepare(ctx context.Context, rec *runs.Record, n int, resumeFrom, why string) (Start, error) {
	s := Start{Attempt: n, RayJob: names.RayJob(rec.RunID, n), ResumeFrom: resumeFrom, Why: why}
	return s, d.ensureResources(ctx, rec, !s.Check())
}

// Mark records the start in r: CHECKING, or PROVISIONED at its attempt.
func (s Start) Mark(r *runs.Record, now time.Time) error {
	if s.Check() {
		return r.MarkChecking(s.RayJob, now)
	}
	prev := r.CurrentAttempt()
	if err := r.MarkProvisioned(runs.Attempt{N: s.Attempt, RayJob: s.RayJob, ResumeFrom: s.ResumeFrom}, s.Why, now); err != nil {
		return err
	}
	if prev != nil && s.PrevCause != nil {
		// Its training code failed (the retry is the cause's: RetryPolicy),
		// or it stalled (limits.stallRestarts).
		p := &r.Attempts[len(r.Attempts)-2]
		p.Cause, p.Reason = s.PrevCause, runs.ApplicationError
		if s.PrevCause.Kind == string(runs.Stalled) {
			p.Reason = runs.Stalled
		}
	}
	return nil
}

// Recorded reports whether r, as last written, is at this start; when it
// is not, another delivery moved the run on, and sends what it needs.
func (s Start) Recorded(r *runs.Record) bool {
	if s.Check() {
		return r.Phase == runs.Checking
	}
	return r.Phase == runs.Provisioned && r.Attempt == s.Attempt
}

// SendStart sends a recorded start's provisioned message. published are
// the events the sender has published and not yet recorded: Submit records
// them in its own write of the record, so that no later step finds their
// claims still held.
func (d *Deps) SendStart(ctx context.Context, runID string, s Start, published ...runs.Phase) error {
	if s.Check() {
		d.Log.Info("data_check_started", "run_id", runID, "rayjob", s.RayJob)
	} else {
		d.Log.Info("attempt_started", "run_id", runID, "attempt", s.Attempt, "resume_from", s.ResumeFrom)
	}
	return d.Send(ctx, d.Config.Topics.Provisioned, Step{RunID: runID, Attempt: s.Attempt, Published: published})
}

// StartAttempt starts attempt n of the run (manifests.CheckAttempt for its
// data check, 1 for its first attempt, n+1 for a retry resuming from
// resumeFrom): Prepare, Mark in an update of the record, SendStart. For a
// retry, why the previous attempt ended goes into its record. It is safe
// to repeat: a redelivery finds the step recorded and sends its message
// again.
func (d *Deps) StartAttempt(ctx context.Context, runID string, n int, resumeFrom, why string) error {
	return d.StartRetry(ctx, runID, n, resumeFrom, why, nil)
}

// StartRetry is StartAttempt for a retry whose previous attempt's training
// code failed with cause prev, recorded on that attempt.
func (d *Deps) StartRetry(ctx context.Context, runID string, n int, resumeFrom, why string, prev *runs.Cause) error {
	rec, err := d.Runs.Get(ctx, runID)
	if err != nil {
		return err
	}
	if n == manifests.CheckAttempt && rec.Phase != runs.Accepted && rec.Phase != runs.Queued && rec.Phase != runs.Checking {
		// Another delivery moved it on already; bringing the cluster up
		// for the check now would scale its workers to zero.
		return nil
	}
	s, err := d.Prepare(ctx, rec, n, resumeFrom, why)
	if err != nil {
		return err
	}
	s.PrevCause = prev
	rec, err = d.Advance(ctx, runID, func(r *runs.Record) error { return s.Mark(r, d.Time()) })
	if err != nil {
		return err
	}
	if !s.Recorded(rec) {
		return nil
	}
	return d.SendStart(ctx, runID, s)
}

// StartFirst starts a run that has its cluster: its data check when its
// spec asks for one, else its first attempt.
func (d *Deps) StartFirst(ctx context.Context, rec *runs.Record) error {
	return d.StartAttempt(ctx, rec.RunID, FirstAttempt(rec), "", "")
}

// CheckJob is the run's data check RayJob, its estimate at the price of the
// first capacity tier (else the deployment's).
func (d *Deps) CheckJob(rec *runs.Record, model *runs.Model) (*rayv1.RayJob, error) {
	run := manifests.Run{ID: rec.RunID, Attempt: 1, Source: rec.Source, SpecHash: rec.SpecHash, Preinstalled: rec.TrainerImage != "", Model: model}
	if err := run.Validate(); err != nil {
		return nil, Permanent(err)
	}
	price := rec.Spec.Tier(0).GPUHourUSD
	if price == 0 {
		price = d.Config.GPUHourUSD
	}
	return manifests.CheckJob(rec.Spec, run, price), nil
}

// ensureResources brings the run's trainer ConfigMap and RayCluster up,
// its worker group scaled to the spec's replicas; without workers, kept
// at zero (the data check runs on the head alone).
func (d *Deps) ensureResources(ctx context.Context, rec *runs.Record, workers bool) error {
	if rec.Spec == nil {
		return Permanent(fmt.Errorf("run %s has no spec", rec.RunID))
	}
	code, err := manifests.TrainerCode()
	if err != nil {
		return Permanent(err)
	}
	if err := d.EnsureConfigMap(ctx, manifests.TrainerConfigMap(rec.Spec, code)); err != nil {
		return err
	}
	rc := manifests.RayCluster(rec.Spec, code, 0)
	if !workers {
		zero := int32(0)
		for i := range rc.Spec.WorkerGroupSpecs {
			rc.Spec.WorkerGroupSpecs[i].Replicas, rc.Spec.WorkerGroupSpecs[i].MinReplicas = &zero, &zero
		}
	}
	return d.EnsureCluster(ctx, rc)
}

// Finish records how the current attempt ended and sends the run to
// finalize. It is safe to repeat; only the first outcome counts.
func (d *Deps) Finish(ctx context.Context, runID string, attempt int, e runs.Ending) error {
	return d.finish(ctx, runID, attempt, e, nil, false)
}

// FinishAnnouncing is Finish for a function that publishes public events
// (Monitor). before, if not nil, changes the record first, in the same
// write. That write also claims the events the run owes (ClaimPending);
// they are published before the finished message goes, and the message
// names them, so that finalize records them published in the write that
// ends the run: one write of the record fewer on the way to the terminal
// event.
func (d *Deps) FinishAnnouncing(ctx context.Context, runID string, attempt int, e runs.Ending, before func(*runs.Record)) error {
	return d.finish(ctx, runID, attempt, e, before, true)
}

func (d *Deps) finish(ctx context.Context, runID string, attempt int, e runs.Ending, before func(*runs.Record), announce bool) error {
	if err := e.Check(); err != nil {
		return Permanent(err)
	}
	now := d.Time()
	var claimed []runs.Phase
	moved := false
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		claimed, moved = nil, false
		if before != nil {
			before(r)
		}
		if err := r.MarkFinishing(attempt, e, now); err != nil {
			return err
		}
		if announce {
			claimed = ClaimPending(r, now)
		}
		moved = true
		return nil
	})
	if err != nil {
		return err
	}
	// Another delivery made the run FINISHING: it sends the message, unless
	// it died before (then its write is older than a live delivery takes
	// to send: this one sends it, as the sweep would later).
	if rec.Phase != runs.Finishing || !moved && now.Sub(rec.UpdatedAt) < ClaimFor {
		return nil
	}
	if err := d.Publish(ctx, rec, claimed, now); err != nil {
		return err
	}
	d.Log.Info("run_finishing", "run_id", runID, "attempt", attempt, "outcome", rec.Outcome, "reason", rec.Reason, "message", rec.Message)
	return d.Send(ctx, d.Config.Topics.Finished, Step{RunID: runID, Attempt: rec.Attempt, Published: claimed})
}

// PassOn takes runID off the cluster and hands the cluster to the first
// waiting run that can take it, starting its first attempt: a run that no
// longer waits (it ended, or was cancelled while queued, or its record was
// never written) is passed over. It returns the lease as left, without a
// holder when nobody took the cluster.
func (d *Deps) PassOn(ctx context.Context, namespace, cluster, runID string) (*Lease, error) {
	lease, next, err := d.Leases.Release(ctx, namespace, cluster, runID)
	for err == nil && next != "" {
		rec, gerr := d.Runs.Get(ctx, next)
		switch {
		case gerr != nil && !errors.Is(gerr, runs.ErrNotFound):
			return nil, gerr
		case gerr == nil && !rec.Phase.Terminal():
			// A run that is ending (FINISHING) keeps the lease; its own
			// finalize passes it on.
			d.Log.Info("cluster_handed_over", "run_id", runID, "cluster", namespace+"/"+cluster, "next_run_id", next)
			return lease, d.StartFirst(ctx, rec)
		}
		d.Log.Info("lease_released", "run_id", next, "cluster", namespace+"/"+cluster, "why", "no longer waiting")
		lease, next, err = d.Leases.Release(ctx, namespace, cluster, next)
	}
	return lease, err
}

// GetRun reads a record; a run that does not exist is permanent for the
// message that named it.
func (d *Deps) GetRun(ctx context.Context, runID string) (*runs.Record, error) {
	rec, err := d.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return nil, Permanent(err)
	}
	return rec, err
}

// Admit gives an accepted or queued run its cluster when the cluster is
// free, and starts its first attempt; otherwise it queues the run behind
// the holder and announces that once.
func (d *Deps) Admit(ctx context.Context, rec *runs.Record) error {
	lease, err := d.Leases.Acquire(ctx, rec.Namespace, rec.Cluster, rec.RunID)
	if err != nil {
		return err
	}
	if lease.Holder == rec.RunID {
		return d.StartFirst(ctx, rec)
	}
	queued := false
	_, err = d.Advance(ctx, rec.RunID, func(r *runs.Record) error {
		err := r.MarkQueued(lease.Holder, d.Time())
		queued = err == nil
		return err
	})
	if err == nil && queued {
		d.Log.Info("run_queued", "run_id", rec.RunID, "cluster", rec.Cluster, "holder", lease.Holder)
	}
	return err
}

// StepRun reads the step message a chained function receives and the record
// of the run it names.
func (d *Deps) StepRun(ctx context.Context, e event.Event) (Step, *runs.Record, error) {
	if e.Type() != PubSubPublished {
		return Step{}, nil, Permanent(fmt.Errorf("unexpected event type %q", e.Type()))
	}
	step, err := DecodeStep(e)
	if err != nil {
		return step, nil, err
	}
	rec, err := d.GetRun(ctx, step.RunID)
	return step, rec, err
}
