// Package submit is the Submit function: on a provisioned message it
// creates the RayJob of the run's current attempt (create-or-get, so a
// redelivery finds the RayJob instead of making another) and asks the
// monitor to look at it.
package submit

import (
	"context"
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/weights"
)

// Handler handles provisioned messages.
type Handler struct{ Deps *pipeline.Deps }

// Handle creates the RayJob for the attempt the message names.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	d := h.Deps
	step, rec, err := d.StepRun(ctx, e)
	if err != nil {
		return err
	}
	if step.Attempt == manifests.CheckAttempt && rec.Phase == runs.Checking && rec.Attempt == 0 {
		return h.check(ctx, rec)
	}
	if rec.Attempt != step.Attempt || rec.Phase != runs.Provisioned {
		d.Log.Info("duplicate_ignored", "run_id", step.RunID, "attempt", step.Attempt, "phase", rec.Phase, "record_attempt", rec.Attempt)
		return nil
	}
	if rec.CancelRequested {
		return d.Finish(ctx, rec.RunID, rec.Attempt, runs.Ending{Outcome: runs.OutcomeCancelled, Reason: runs.ReasonCancelled, Message: "cancelled before the job started"})
	}
	run := manifests.Run{ID: rec.RunID, Attempt: rec.Attempt, Source: rec.Source, SpecHash: rec.SpecHash, Preinstalled: rec.TrainerImage != ""}
	if a := rec.CurrentAttempt(); a != nil {
		run.ResumeFrom = a.ResumeFrom
	}
	if c := rec.Check; c != nil && c.Result != nil && c.Result.Dataset != nil {
		run.DatasetRevision = c.Result.Dataset.ResolvedRevision // the data checked, even if the branch moved
	}
	model, err := h.model(ctx, rec)
	if errors.Is(err, errRefused) {
		return nil
	} else if err != nil {
		return err
	}
	run.Model = model
	if err := run.Validate(); err != nil {
		return pipeline.Permanent(err)
	}
	job := manifests.RayJob(rec.Spec, run)
	if err := h.create(ctx, rec, job); errors.Is(err, errRefused) {
		return nil
	} else if err != nil {
		return err
	}
	changed := false
	rec, err = d.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		err := r.MarkSubmitted(step.Attempt, d.Time())
		changed = err == nil
		if changed && model != nil {
			r.Model = model
		}
		// What the provisioned message says went out (Provision's accepted
		// event), recorded in this write rather than waiting for Provision's
		// own.
		pipeline.RecordPublished(r, step.Published)
		return err
	})
	if err != nil {
		return err
	}
	if !changed {
		// A concurrent delivery recorded the submission (and sent the
		// submitted message) first.
		d.Log.Info("duplicate_ignored", "run_id", rec.RunID, "attempt", step.Attempt, "phase", rec.Phase)
		return nil
	}
	d.Log.Info("rayjob_created", "run_id", rec.RunID, "attempt", step.Attempt, "rayjob", job.Name, "namespace", job.Namespace)
	if model != nil {
		d.Log.Info("model_staged", "run_id", rec.RunID, "model", model.Repo, "commit", model.Commit, "uri", model.URI,
			"staged", model.Staged, "staged_by", model.StagedBy)
	}
	return d.Send(ctx, d.Config.Topics.Submitted, step)
}

// check creates the data check's RayJob of a checking run (it is safe to
// repeat) and tells the monitor, which judges its verdict.
func (h *Handler) check(ctx context.Context, rec *runs.Record) error {
	d := h.Deps
	if rec.CancelRequested {
		return d.Finish(ctx, rec.RunID, rec.Attempt, runs.Ending{Outcome: runs.OutcomeCancelled, Reason: runs.ReasonCancelled, Message: "cancelled before the data check started"})
	}
	// The check's driver stages the base model (or waits for the run that
	// does), on the head, before any GPU worker is asked for.
	model, err := h.model(ctx, rec)
	if errors.Is(err, errRefused) {
		return nil
	} else if err != nil {
		return err
	}
	job, err := d.CheckJob(rec, model)
	if err != nil {
		return err
	}
	if err := h.create(ctx, rec, job); errors.Is(err, errRefused) {
		return nil
	} else if err != nil {
		return err
	}
	d.Log.Info("rayjob_created", "run_id", rec.RunID, "attempt", manifests.CheckAttempt, "rayjob", job.Name, "namespace", job.Namespace, "data_check", true)
	if model != nil && rec.Model == nil {
		// The commit is pinned now: training reads what the check staged.
		if _, err := d.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
			if r.Model != nil {
				return runs.ErrNoChange
			}
			r.Model = model
			return nil
		}); err != nil {
			return err
		}
	}
	return d.Send(ctx, d.Config.Topics.Submitted, pipeline.Step{RunID: rec.RunID, Attempt: manifests.CheckAttempt})
}

// errRefused: the API server refused the RayJob for good, or the Hub the
// model, and the run ended for it.
var errRefused = errors.New("refused for good")

// model is where the run's base model is read from (Deps.StageModel). A
// model or revision the Hub does not have, or refuses the token for, fails
// the run (InvalidModel) and sends it to finalize: errRefused then.
func (h *Handler) model(ctx context.Context, rec *runs.Record) (*runs.Model, error) {
	m, err := h.Deps.StageModel(ctx, rec)
	if !weights.IsPermanent(err) {
		return m, err
	}
	h.Deps.Log.Error("model_refused", "run_id", rec.RunID, "attempt", rec.Attempt, "error", err.Error())
	if ferr := h.Deps.Finish(ctx, rec.RunID, rec.Attempt, runs.Ending{Outcome: runs.OutcomeFailed, Reason: runs.InvalidModel, Message: err.Error()}); ferr != nil {
		return nil, ferr
	}
	return nil, errRefused
}

// create creates the RayJob of the run's current step (create-or-get). One
// the API server refuses for good (Invalid, BadRequest) fails the run
// (InvalidJob) and sends it to finalize, which releases its cluster: no
// redelivery, nor the sweep's resend of the step, could make the server
// take it. It returns errRefused then, with nothing left to do.
func (h *Handler) create(ctx context.Context, rec *runs.Record, job *rayv1.RayJob) error {
	err := h.Deps.CreateRayJob(ctx, job)
	if !pipeline.IsPermanent(err) {
		return err
	}
	h.Deps.Log.Error("rayjob_refused", "run_id", rec.RunID, "attempt", rec.Attempt, "rayjob", job.Name, "error", err.Error())
	msg := fmt.Sprintf("the API server refused RayJob %s/%s: %v", job.Namespace, job.Name, err)
	if ferr := h.Deps.Finish(ctx, rec.RunID, rec.Attempt, runs.Ending{Outcome: runs.OutcomeFailed, Reason: runs.InvalidJob, Message: msg}); ferr != nil {
		return ferr
	}
	return errRefused
}
