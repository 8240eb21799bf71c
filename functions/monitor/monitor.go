// Package monitor is the Monitor function. It looks at one run when a
// submitted message arrives or when the trainer's completion mark lands in
// the bucket (the fast path to finalize), and on every scheduler tick it
// sweeps all active runs with one LIST of RayJobs, so a run whose message was
// lost is still driven to its end. It records phase changes and training
// progress, enforces deadlines, acts on cancellation, retries attempts lost
// to infrastructure, sends finished runs to finalize, and scales idle
// clusters' workers to zero.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// lostJob is how long a just-created RayJob may be missing from a listing
// before the run counts it as lost.
const lostJob = 2 * time.Minute

// sweepWorkers is how many runs a sweep checks at once.
const sweepWorkers = 32

// Handler handles submitted messages, ticks and completion marks.
type Handler struct{ *pipeline.Deps }

// Handle dispatches on the event.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	switch e.Type() {
	case pipeline.StorageFinalized:
		o, err := pipeline.DecodeObject(e)
		if err != nil {
			return err
		}
		runID, ok := markRun(o.Name)
		if !ok {
			return nil // not a completion mark
		}
		return h.check(ctx, runID, nil)
	case pipeline.PubSubPublished:
		if pipeline.TopicOf(e) == h.Config.Topics.Ticks {
			return h.Sweep(ctx)
		}
		step, err := pipeline.DecodeStep(e)
		if err != nil {
			return err
		}
		return h.check(ctx, step.RunID, nil)
	}
	return pipeline.Permanent(fmt.Errorf("unexpected event type %q from %s", e.Type(), e.Source()))
}

// markRun is the run ID of a completion mark's object name:
// [<prefix>/]<runID>/attempt-<n>/raydrop_result.json.
func markRun(name string) (string, bool) {
	parts := strings.Split(name, "/")
	if len(parts) < 3 || parts[len(parts)-1] != checkpoints.MarkFile || !strings.HasPrefix(parts[len(parts)-2], "attempt-") {
		return "", false
	}
	return parts[len(parts)-3], true
}

// check looks at one run. listed holds the RayJobs the sweep listed (nil:
// fetch the run's RayJob); a sweep also resends the messages of steps that
// stalled.
func (h *Handler) check(ctx context.Context, runID string, listed map[string]*rayv1.RayJob) error {
	sweep := listed != nil
	rec, err := h.GetRun(ctx, runID)
	if err != nil {
		return err
	}
	now := h.Time()
	stale := now.Sub(rec.UpdatedAt) > pipeline.StaleStep
	switch rec.Phase {
	case runs.Submitted, runs.Running:
	case runs.Accepted, runs.Queued:
		if rec.CancelRequested {
			return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeCancelled, "cancelled while queued")
		}
		if sweep {
			return h.readmit(ctx, rec)
		}
		return nil
	case runs.Provisioned:
		if rec.CancelRequested {
			return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeCancelled, "cancelled before the job started")
		}
		if sweep && stale {
			return h.resend(ctx, rec, "provisioned", h.Config.Topics.Provisioned)
		}
		return nil
	case runs.Finishing:
		if sweep && stale {
			return h.resend(ctx, rec, "finished", h.Config.Topics.Finished)
		}
		return nil
	case runs.Succeeded, runs.Failed, runs.Cancelled, runs.Rejected:
		// Listed because it is unannounced: the delivery that ended it died
		// before its event went out. Finalize finishes what it left.
		if sweep && stale && rec.Unannounced() {
			return h.resend(ctx, rec, "finished", h.Config.Topics.Finished)
		}
		return nil
	default:
		return pipeline.Permanent(fmt.Errorf("run %s is in phase %q, which the monitor does not know", runID, rec.Phase))
	}

	a := rec.CurrentAttempt()
	if a == nil {
		return pipeline.Permanent(fmt.Errorf("run %s is %s without an attempt", runID, rec.Phase))
	}
	jobName := names.RayJob(runID, rec.Attempt)
	job := listed[jobName]
	if !sweep {
		job, err = h.Ray.RayV1().RayJobs(rec.Namespace).Get(ctx, jobName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			job = nil
		} else if err != nil {
			return fmt.Errorf("get rayjob %s/%s: %w", rec.Namespace, jobName, err)
		}
	}

	lim := rec.Spec.Limits
	switch {
	case rec.CancelRequested:
		if err := h.DeleteRayJob(ctx, rec.Namespace, jobName); err != nil {
			return err
		}
		return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeCancelled, "cancelled by request")
	case now.Sub(a.CreatedAt) > time.Duration(lim.Deadline):
		if err := h.DeleteRayJob(ctx, rec.Namespace, jobName); err != nil {
			return err
		}
		return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeFailed, fmt.Sprintf("deadline exceeded: the attempt ran longer than limits.deadline %s", time.Duration(lim.Deadline)))
	case a.RunningAt == nil && now.Sub(a.CreatedAt) > time.Duration(lim.StartDeadline):
		if err := h.DeleteRayJob(ctx, rec.Namespace, jobName); err != nil {
			return err
		}
		return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeFailed, fmt.Sprintf("start deadline exceeded: the job did not start running within limits.startDeadline %s", time.Duration(lim.StartDeadline)))
	}

	bucket, exp := pipeline.Experiment(rec, rec.Attempt)
	store := h.Objects.Bucket(bucket)
	mark, err := checkpoints.ReadMark(ctx, store, exp)
	if err != nil {
		return err
	}
	if mark != nil {
		if mark.Status == "succeeded" {
			return h.succeed(ctx, rec, store, exp)
		}
		// The training code failed: no retry can fix that.
		return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeFailed, "training failed: "+firstLine(mark.Error))
	}
	if job == nil {
		if rec.Phase == runs.Submitted && now.Sub(rec.UpdatedAt) < lostJob {
			return nil // just created; a list may not show it yet
		}
		return h.retryOrFail(ctx, rec, store, exp, "RayJob "+jobName+" disappeared")
	}
	st := job.Status
	if rayv1.IsJobDeploymentTerminal(st.JobDeploymentStatus) || st.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed {
		if st.JobDeploymentStatus == rayv1.JobDeploymentStatusComplete && st.JobStatus == rayv1.JobStatusSucceeded {
			return h.succeed(ctx, rec, store, exp)
		}
		reason := fmt.Sprintf("RayJob %s ended %s/%s", jobName, st.JobDeploymentStatus, st.JobStatus)
		if st.Reason != "" || st.Message != "" {
			reason += fmt.Sprintf(" (%s: %s)", st.Reason, firstLine(st.Message))
		}
		if st.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed {
			return h.Finish(ctx, runID, rec.Attempt, pipeline.OutcomeFailed, reason)
		}
		// The job ended without the trainer's mark: the trainer did not get
		// to write it, so the cause is outside the training code.
		return h.retryOrFail(ctx, rec, store, exp, reason)
	}
	if st.JobStatus == rayv1.JobStatusRunning {
		return h.progress(ctx, rec, store, exp)
	}
	return nil
}

// resend sends a stalled step's message again. It first touches the record
// (its UpdatedAt), so the step counts as stale again only a full StaleStep
// later: however often ticks come, a stalled step is resent once per
// StaleStep, never in a storm that buries the message behind its copies.
func (h *Handler) resend(ctx context.Context, rec *runs.Record, step, topic string) error {
	phase, attempt := rec.Phase, rec.Attempt
	if _, err := h.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		if r.Phase != phase || r.Attempt != attempt {
			return errMoved
		}
		return nil
	}); errors.Is(err, errMoved) {
		return nil // the step went on meanwhile
	} else if err != nil {
		return err
	}
	h.Log.Warn("step_resent", "run_id", rec.RunID, "step", step)
	return h.Send(ctx, topic, pipeline.Step{RunID: rec.RunID, Attempt: attempt})
}

// errMoved says a record left the phase a resend was for.
var errMoved = errors.New("the run moved on")

// succeed sends a successful attempt to finalize. A job so short that no
// check saw it running is recorded as having run first, so subscribers
// always get running before succeeded.
func (h *Handler) succeed(ctx context.Context, rec *runs.Record, store checkpoints.Store, exp string) error {
	if rec.Phase == runs.Submitted {
		if err := h.progress(ctx, rec, store, exp); err != nil {
			return err
		}
	}
	return h.Finish(ctx, rec.RunID, rec.Attempt, pipeline.OutcomeSucceeded, "")
}

// progress records that the attempt runs, with its latest step, epoch and
// loss, and announces the running phase once.
func (h *Handler) progress(ctx context.Context, rec *runs.Record, store checkpoints.Store, exp string) error {
	var p *runs.Progress
	if res, err := checkpoints.Discover(ctx, store, exp); err == nil && res.LastMetrics != nil {
		m := res.LastMetrics
		p = &runs.Progress{Step: int64(m["step"]), Epoch: m["epoch"], UpdatedAt: h.Time()}
		if l, ok := m["loss"]; ok {
			p.Loss = &l
		}
		if max := rec.Spec.Training.MaxSteps; max > 0 {
			p.TotalSteps = int64(max)
		}
	}
	if rec.Phase == runs.Running && (p == nil || rec.Progress != nil && rec.Progress.Step == p.Step && rec.Progress.Epoch == p.Epoch) {
		// Nothing new since the record was read: no second read, no write.
		_, err := h.Announce(ctx, rec, "running")
		return err
	}
	attempt := rec.Attempt
	rec, err := h.Runs.Update(ctx, rec.RunID, func(r *runs.Record) error {
		if r.Attempt != attempt || (r.Phase != runs.Submitted && r.Phase != runs.Running) {
			return runs.ErrNoChange
		}
		changed := false
		if r.Phase == runs.Submitted {
			now := h.Time()
			r.Enter(runs.Running, now)
			if a := r.CurrentAttempt(); a != nil && a.RunningAt == nil {
				a.RunningAt = &now
			}
			changed = true
		}
		if p != nil && (r.Progress == nil || r.Progress.Step != p.Step || r.Progress.Epoch != p.Epoch) {
			r.Progress = p
			changed = true
		}
		if !changed {
			return runs.ErrNoChange
		}
		return nil
	})
	if err != nil {
		return err
	}
	if rec.Phase == runs.Running {
		_, err = h.Announce(ctx, rec, "running")
	}
	return err
}

// retryOrFail starts the next attempt, resuming from the newest complete
// checkpoint, when the spec allows another; else the run fails.
func (h *Handler) retryOrFail(ctx context.Context, rec *runs.Record, store checkpoints.Store, exp, reason string) error {
	if rec.Attempt > rec.Spec.Limits.Retries {
		if rec.Attempt > 1 {
			reason = fmt.Sprintf("%s; no retries left after %d attempts", reason, rec.Attempt)
		}
		return h.Finish(ctx, rec.RunID, rec.Attempt, pipeline.OutcomeFailed, reason)
	}
	resume := ""
	if a := rec.CurrentAttempt(); a != nil {
		resume = a.ResumeFrom
	}
	res, err := checkpoints.Discover(ctx, store, exp)
	if err != nil {
		return err
	}
	if res.Latest != nil {
		resume = res.Latest.URI
	}
	h.Log.Warn("attempt_retried", "run_id", rec.RunID, "attempt", rec.Attempt, "reason", reason, "resume_from", resume)
	return h.StartAttempt(ctx, rec.RunID, rec.Attempt+1, resume, reason)
}

// readmit gives a queued (or stalled accepted) run the cluster when its
// holder is gone.
func (h *Handler) readmit(ctx context.Context, rec *runs.Record) error {
	lease, err := h.Leases.Get(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return err
	}
	if lease.Holder != "" && lease.Holder != rec.RunID {
		holder, err := h.Runs.Get(ctx, lease.Holder)
		switch {
		case errors.Is(err, runs.ErrNotFound) || err == nil && holder.Phase.Terminal():
			h.Log.Warn("lease_released", "cluster", rec.Cluster, "holder", lease.Holder, "why", "holder ended")
			if _, _, err := h.Leases.Release(ctx, rec.Namespace, rec.Cluster, lease.Holder); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			return nil // the holder is still at work
		}
	}
	if rec.Phase == runs.Queued {
		return h.Admit(ctx, rec)
	}
	if h.Time().Sub(rec.UpdatedAt) > pipeline.StaleStep {
		// The intake delivery stopped after recording the run: announce it
		// (a claim left by a delivery that died has expired by now), then
		// admit it, as that delivery would have.
		if rec, err = h.Announce(ctx, rec, "accepted"); err != nil {
			return err
		}
		return h.Admit(ctx, rec)
	}
	return nil
}

// Sweep checks every active run against one LIST of RayJobs, then scales
// down clusters that have workers and no active run.
func (h *Handler) Sweep(ctx context.Context) error {
	sums, err := h.Runs.List(ctx)
	if err != nil {
		return err
	}
	sel := metav1.ListOptions{LabelSelector: names.LabelManagedBy + "=" + names.ManagedBy}
	jobList, err := h.Ray.RayV1().RayJobs(metav1.NamespaceAll).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list rayjobs: %w", err)
	}
	jobs := map[string]*rayv1.RayJob{}
	for i := range jobList.Items {
		j := &jobList.Items[i]
		jobs[j.Name] = j
	}
	busy := map[string]bool{}
	var active []string
	for _, s := range sums {
		if s.Phase.Active() {
			busy[s.Cluster] = true
		}
		if s.Phase.Active() || s.Unannounced {
			active = append(active, s.RunID)
		}
	}
	// Each check is a few Cloud Storage reads: run them side by side, or a
	// thousand active runs would take minutes at cloud latencies.
	var mu sync.Mutex
	var errs []error
	g := errgroup.Group{}
	g.SetLimit(sweepWorkers)
	for _, runID := range active {
		g.Go(func() error {
			if err := h.check(ctx, runID, jobs); err != nil {
				h.Log.Warn("sweep_check_failed", "run_id", runID, "error", err.Error())
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // the checks report through errs
	checked := len(active)
	scaled, err := h.scaleDownIdle(ctx, busy)
	if err != nil {
		errs = append(errs, err)
	}
	h.Log.Info("sweep_done", "active_runs", checked, "rayjobs", len(jobList.Items), "scaled_to_zero", scaled)
	// A tick that failed for one run is not redelivered: the next tick
	// comes in a minute and sweeps everything again.
	if len(errs) > 0 {
		h.Log.Warn("sweep_incomplete", "errors", len(errs), "first", errs[0].Error())
	}
	return nil
}

// scaleDownIdle scales to zero every raydrop cluster that asks for workers
// while no active run uses it and nobody has held it for the grace period.
func (h *Handler) scaleDownIdle(ctx context.Context, busy map[string]bool) (int, error) {
	sel := metav1.ListOptions{LabelSelector: names.LabelManagedBy + "=" + names.ManagedBy}
	list, err := h.Ray.RayV1().RayClusters(metav1.NamespaceAll).List(ctx, sel)
	if err != nil {
		return 0, fmt.Errorf("list rayclusters: %w", err)
	}
	n := 0
	for i := range list.Items {
		rc := &list.Items[i]
		if !pipeline.HasWorkers(rc) || busy[rc.Namespace+"/"+rc.Name] {
			continue
		}
		lease, err := h.Leases.Get(ctx, rc.Namespace, rc.Name)
		if err != nil {
			return n, err
		}
		if h.Time().Sub(lease.Updated) < h.Config.ScaleDownAge {
			continue
		}
		if _, err := h.ScaleToZero(ctx, rc.Namespace, rc.Name); err != nil {
			return n, err
		}
		h.Log.Warn("cluster_scaled_to_zero", "cluster", rc.Namespace+"/"+rc.Name, "why", "workers and no active run")
		n++
	}
	return n, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}
