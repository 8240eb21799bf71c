package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// StartAttempt brings the run's cluster up for attempt n (1 for a new run,
// n+1 for a retry resuming from resumeFrom), records it as PROVISIONED and
// sends the provisioned message. It is safe to repeat.
// For a retry, why the previous attempt ended goes into its record.
func (d *Deps) StartAttempt(ctx context.Context, runID string, n int, resumeFrom, why string) error {
	rec, err := d.Runs.Get(ctx, runID)
	if err != nil {
		return err
	}
	if err := d.EnsureResources(ctx, rec); err != nil {
		return err
	}
	rec, err = d.Advance(ctx, runID, func(r *runs.Record) error {
		return r.MarkProvisioned(runs.Attempt{N: n, RayJob: names.RayJob(runID, n), ResumeFrom: resumeFrom}, why, d.Time())
	})
	if err != nil {
		return err
	}
	// A redelivery finds the attempt started and sends its message again.
	if rec.Attempt != n || rec.Phase != runs.Provisioned {
		return nil // another delivery moved it on already
	}
	d.Log.Info("attempt_started", "run_id", runID, "attempt", n, "resume_from", resumeFrom)
	return d.Send(ctx, d.Config.Topics.Provisioned, Step{RunID: runID, Attempt: n})
}

// StartFirst starts a run that has its cluster: with the data check when
// its spec asks for one (StartCheck), else its first attempt.
func (d *Deps) StartFirst(ctx context.Context, rec *runs.Record) error {
	if rec.Spec != nil && rec.Spec.Dataset.Check {
		return d.StartCheck(ctx, rec.RunID)
	}
	return d.StartAttempt(ctx, rec.RunID, 1, "", "")
}

// StartCheck brings the run's cluster up with its worker group at zero,
// records the run CHECKING and sends the provisioned message for the check
// (attempt 0): Submit creates the check's RayJob on the head. No GPU worker
// is asked for until the check passes (the monitor then starts the first
// attempt). It is safe to repeat.
func (d *Deps) StartCheck(ctx context.Context, runID string) error {
	rec, err := d.Runs.Get(ctx, runID)
	if err != nil {
		return err
	}
	if rec.Phase != runs.Accepted && rec.Phase != runs.Queued && rec.Phase != runs.Checking {
		return nil // another delivery moved it on already
	}
	job, err := d.PrepareCheck(ctx, rec)
	if err != nil {
		return err
	}
	rec, err = d.Advance(ctx, runID, func(r *runs.Record) error { return r.MarkChecking(job, d.Time()) })
	if err != nil {
		return err
	}
	if rec.Phase != runs.Checking {
		return nil
	}
	d.Log.Info("data_check_started", "run_id", runID, "rayjob", job)
	return d.SendCheck(ctx, runID)
}

// PrepareCheck brings the run's cluster up with its worker group at zero;
// it returns the name of the data check's RayJob, which Submit creates.
func (d *Deps) PrepareCheck(ctx context.Context, rec *runs.Record) (string, error) {
	if err := d.ensureResources(ctx, rec, false); err != nil {
		return "", err
	}
	return names.RayJob(rec.RunID, manifests.CheckAttempt), nil
}

// CheckJob is the run's data check RayJob, its estimate at the price of the
// first capacity tier (else the deployment's).
func (d *Deps) CheckJob(rec *runs.Record) (*rayv1.RayJob, error) {
	run := manifests.Run{ID: rec.RunID, Attempt: 1, Source: rec.Source, SpecHash: rec.SpecHash}
	if err := run.Validate(); err != nil {
		return nil, Permanent(err)
	}
	price := rec.Spec.Tier(0).GPUHourUSD
	if price == 0 {
		price = d.Config.GPUHourUSD
	}
	return manifests.CheckJob(rec.Spec, run, price), nil
}

// SendCheck sends the provisioned message of a checking run (attempt 0),
// on which Submit creates the check's RayJob.
func (d *Deps) SendCheck(ctx context.Context, runID string) error {
	return d.Send(ctx, d.Config.Topics.Provisioned, Step{RunID: runID, Attempt: manifests.CheckAttempt})
}

// EnsureResources makes sure the run's trainer ConfigMap and RayCluster
// exist, its worker group scaled to the spec's replicas.
func (d *Deps) EnsureResources(ctx context.Context, rec *runs.Record) error {
	return d.ensureResources(ctx, rec, true)
}

// ensureResources is EnsureResources; without workers, the worker group is
// kept at zero (the data check runs on the head alone).
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

// StorageOf is the run's storage path (Ray Train's storage_path, where the
// data check writes too) as a bucket and an object prefix.
func StorageOf(rec *runs.Record) (bucket, prefix string) {
	bucket, prefix, _ = strings.Cut(strings.TrimPrefix(manifests.StoragePath(rec.Spec, rec.RunID), "gs://"), "/")
	return bucket, prefix
}

// Experiment is where an attempt's Ray Train experiment lives: its bucket
// and the object prefix of its experiment folder.
func Experiment(rec *runs.Record, attempt int) (bucket, prefix string) {
	p := manifests.StoragePath(rec.Spec, rec.RunID) + "/" + manifests.ExperimentName(attempt)
	rest := strings.TrimPrefix(p, "gs://")
	bucket, prefix, _ = strings.Cut(rest, "/")
	return bucket, prefix
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
