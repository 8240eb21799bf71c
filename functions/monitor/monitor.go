// Package monitor is the Monitor function. It looks at one run when a
// submitted message arrives or a checkpoint bucket announces the trainer's
// completion mark (its notice: the fast path to finalize), and on every
// tick sweeps all active runs with one LIST of RayJobs, so a run whose
// message was lost is still driven to its end (sweep.go). Each check reads
// the record, the RayJob and the completion mark, lets Decide judge the run
// (decide.go, a pure function), and acts: it records progress, enforces
// deadlines, acts on cancellation, retries attempts lost to
// infrastructure, sends finished runs to finalize, resends stalled steps.
package monitor

import (
	"context"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Handler handles submitted messages, ticks and completion marks.
type Handler struct{ Deps *pipeline.Deps }

// Handle dispatches on the event.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	switch e.Type() {
	case pipeline.PubSubPublished:
		switch pipeline.TopicOf(e) {
		case h.Deps.Config.Topics.Ticks:
			return h.Sweep(ctx)
		case h.Deps.Config.Topics.Marks:
			return h.notice(ctx, e)
		}
		step, err := pipeline.DecodeStep(e)
		if err != nil {
			return err
		}
		if step.SweepID != "" {
			return h.advanceSweep(ctx, step.SweepID)
		}
		return h.check(ctx, step.RunID, nil)
	}
	return pipeline.Permanent(fmt.Errorf("unexpected event type %q from %s", e.Type(), e.Source()))
}

// notice checks the run whose mark notice a checkpoint bucket announced:
// a Cloud Storage notification, filtered to names.NoticePrefix, whose
// objectId attribute names the notice
// (https://cloud.google.com/storage/docs/pubsub-notifications#attributes).
func (h *Handler) notice(ctx context.Context, e event.Event) error {
	m, err := pipeline.DecodeMessage(e)
	if err != nil {
		return err
	}
	attrs := m.Message.Attributes
	if attrs["eventType"] != "OBJECT_FINALIZE" {
		return nil // a deletion or metadata change announces nothing
	}
	runID, ok := names.RunOfNotice(attrs["objectId"])
	if !ok {
		h.Deps.Log.Warn("notice_ignored", "bucket", attrs["bucketId"], "object", attrs["objectId"], "why", "not a mark notice ("+names.NoticePrefix+"<run>/attempt-<n>.json)")
		return nil
	}
	return h.check(ctx, runID, nil)
}

// attemptFiles is where the current attempt writes: its experiment folder.
type attemptFiles struct {
	store checkpoints.Store
	exp   string
}

// listing is what a sweep lists once for all its checks: the RayJobs by
// name, the worker pods and KubeRay's DeletedWorkerPod Events by
// namespace/cluster.
type listing struct {
	jobs    map[string]*rayv1.RayJob
	workers map[string][]corev1.Pod
	lost    map[string][]corev1.Event
}

// check looks at one run: it observes, decides, then acts. listed is what
// the sweep listed (nil: a check on one run, which reads the run's RayJob
// and worker pods).
func (h *Handler) check(ctx context.Context, runID string, listed *listing) error {
	rec, err := h.Deps.GetRun(ctx, runID)
	if err != nil {
		return err
	}
	o := Observation{Run: rec, Sweep: listed != nil, Now: h.Deps.Time()}
	var files attemptFiles
	if rec.Phase.HasJob() && rec.Spec != nil {
		if o.Job, err = h.job(ctx, rec, listed); err != nil {
			return err
		}
		bucket, exp := manifests.Experiment(rec.Spec, rec.RunID, rec.Attempt)
		files = attemptFiles{h.Deps.Objects.Bucket(bucket), exp}
		if o.Mark, err = checkpoints.ReadMark(ctx, files.store, files.exp); gcp.Unreadable(err) {
			o.Unreadable = err.Error()
		} else if err != nil {
			return err
		}
		if o.Workers, err = h.workers(ctx, rec, listed); err != nil {
			return err
		}
		refused, err := h.notCreated(ctx, rec, o.Workers)
		if err != nil {
			return err
		}
		if refused != "" {
			o.Workers.Pending = refused
		}
		if o.EarlyStop, err = h.earlyStop(ctx, rec, files); err != nil {
			return err
		}
		if m := o.Mark; m != nil && m.Status == "failed" && !m.NoticeSeen && !rec.CancelRequested {
			o.Cause = h.causeOf(ctx, rec, m, files)
		}
		o.Pulse, o.Stacks = h.pulse(ctx, rec, files), h.stacks(ctx, rec)
	}
	if rec.Phase == runs.Checking && rec.Spec != nil {
		if o.Job, err = h.job(ctx, rec, listed); err != nil {
			return err
		}
		bucket, prefix := manifests.Storage(rec.Spec, rec.RunID)
		if o.Check, err = checkpoints.ReadDataCheck(ctx, h.Deps.Objects.Bucket(bucket), prefix); err != nil {
			if !gcp.Unreadable(err) {
				return err
			}
			// A verdict that can never be read: the check cannot pass.
			o.Check = &checkpoints.DataCheck{Reason: string(runs.InvalidData), Message: err.Error()}
		}
	}
	d, err := Decide(o)
	if err != nil {
		return pipeline.Permanent(err)
	}
	return h.act(ctx, rec, d, files)
}

// job is the run's current RayJob: from the sweep's listing, or read.
func (h *Handler) job(ctx context.Context, rec *runs.Record, listed *listing) (*rayv1.RayJob, error) {
	name := names.RayJob(rec.RunID, rec.Attempt)
	if listed != nil {
		return listed.jobs[name], nil
	}
	job, err := h.Deps.Ray.RayV1().RayJobs(rec.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get rayjob %s/%s: %w", rec.Namespace, name, err)
	}
	return job, nil
}

// act carries a decision out.
func (h *Handler) act(ctx context.Context, rec *runs.Record, d Decision, files attemptFiles) error {
	if err := h.notePreemptions(ctx, rec, d.Preempted); err != nil {
		return err
	}
	switch d.Action {
	case Wait:
		return h.noteWaiting(ctx, rec, d.Why)
	case NextTier:
		return h.nextTier(ctx, rec, d.Why, d.Pending)
	case Readmit:
		return h.readmit(ctx, rec)
	case Resend:
		return h.resend(ctx, rec, d.Topic)
	case Finish:
		if d.DeleteJob {
			// Deleting the RayJob deletes its submitter and stops the job:
			// what the pods can tell is kept first.
			h.Deps.KeepEvidence(ctx, rec, rec.Attempt)
			if err := h.Deps.DeleteRayJob(ctx, rec.Namespace, names.RayJob(rec.RunID, rec.Attempt)); err != nil {
				return err
			}
		}
		var before func(*runs.Record)
		if d.Check != nil {
			before = func(r *runs.Record) { r.NoteCheck(d.Check, h.Deps.Time()) }
		}
		return h.Deps.FinishAnnouncing(ctx, rec.RunID, rec.Attempt, d.Ending, before)
	case Progress:
		return h.progress(ctx, rec, files, d)
	case Succeed:
		// A job so short that no check saw it running is recorded as having
		// run, in the same write: subscribers get running before succeeded.
		// One that ended between two checks has its first report noted.
		var ran func(*runs.Record)
		if a := rec.CurrentAttempt(); rec.Phase == runs.Submitted || a != nil && a.FirstReportAt == nil {
			p, first := h.latest(ctx, rec, files)
			ran = func(r *runs.Record) {
				r.NoteStarted(rec.Attempt, d.ServedOn, d.Startup)
				r.NoteFirstReport(rec.Attempt, first.at, first.startup)
				if r.MarkRunning(rec.Attempt, h.Deps.Time()) == nil && p != nil {
					r.Progress = p
				}
			}
		}
		return h.Deps.FinishAnnouncing(ctx, rec.RunID, rec.Attempt, runs.Ending{Outcome: runs.OutcomeSucceeded}, ran)
	case Retry:
		return h.retry(ctx, rec, d, files)
	case Checked:
		return h.checked(ctx, rec)
	case Stall:
		return h.stall(ctx, rec, d.Stall)
	}
	return pipeline.Permanent(fmt.Errorf("run %s: decision %q has no action", rec.RunID, d.Action))
}

// retry starts the next attempt, resuming from the newest complete
// checkpoint of this one (or the one this one resumed from).
func (h *Handler) retry(ctx context.Context, rec *runs.Record, d Decision, files attemptFiles) error {
	resume := ""
	if a := rec.CurrentAttempt(); a != nil {
		resume = a.ResumeFrom
	}
	res, err := checkpoints.Discover(ctx, files.store, files.exp)
	switch {
	case gcp.Unreadable(err):
		h.Deps.Log.Warn("checkpoints_unreadable", "run_id", rec.RunID, "attempt", rec.Attempt, "error", err.Error())
	case err != nil:
		return err
	case res.Latest != nil:
		resume = res.Latest.URI
	}
	h.Deps.Log.Warn("attempt_retried", "run_id", rec.RunID, "attempt", rec.Attempt, "reason", d.Why, "resume_from", resume)
	// The next attempt replaces this one's pods: what they can tell of
	// how it ended is kept first. A job still running (a stalled one) is
	// stopped, its RayJob deleted, before the next takes its cluster.
	h.Deps.KeepEvidence(ctx, rec, rec.Attempt)
	if d.DeleteJob {
		if err := h.Deps.DeleteRayJob(ctx, rec.Namespace, names.RayJob(rec.RunID, rec.Attempt)); err != nil {
			return err
		}
	}
	return h.Deps.StartRetry(ctx, rec.RunID, rec.Attempt+1, resume, d.Why, d.Cause)
}
