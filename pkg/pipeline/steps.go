package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"

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

// EnsureResources makes sure the run's trainer ConfigMap and RayCluster
// exist.
func (d *Deps) EnsureResources(ctx context.Context, rec *runs.Record) error {
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
	return d.EnsureCluster(ctx, manifests.RayCluster(rec.Spec, code))
}

// Finish records how the current attempt ended and sends the run to
// finalize. It is safe to repeat; only the first outcome counts.
func (d *Deps) Finish(ctx context.Context, runID string, attempt int, e runs.Ending) error {
	if err := e.Check(); err != nil {
		return Permanent(err)
	}
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		return r.MarkFinishing(attempt, e, d.Time())
	})
	if err != nil {
		return err
	}
	if rec.Phase != runs.Finishing {
		return nil
	}
	d.Log.Info("run_finishing", "run_id", runID, "attempt", attempt, "outcome", rec.Outcome, "reason", rec.Reason, "message", rec.Message)
	return d.Send(ctx, d.Config.Topics.Finished, Step{RunID: runID, Attempt: rec.Attempt})
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
		return d.StartAttempt(ctx, rec.RunID, 1, "", "")
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
