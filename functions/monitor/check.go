package monitor

import (
	"context"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// decideCheck judges a run whose data check runs on the Ray head:
// cancellation and the start deadline first (no GPU worker exists yet, so
// the check's time counts against it), then the check's verdict, then what
// KubeRay says of its RayJob.
func decideCheck(o Observation) Decision {
	r := o.Run
	since := r.UpdatedAt
	if r.Check != nil {
		since = r.Check.CreatedAt
	}
	switch {
	case r.CancelRequested:
		return cancel("cancelled during the data check", true)
	case r.Spec != nil && o.Now.Sub(since) > time.Duration(r.Spec.Limits.StartDeadline):
		return fail(runs.DataCheckFailed, true, "the data check did not end within limits.startDeadline %s", time.Duration(r.Spec.Limits.StartDeadline))
	case o.Check != nil && o.Check.OK:
		return Decision{Action: Checked}
	case o.Check != nil:
		reason := runs.InvalidData
		if o.Check.Reason == string(runs.InvalidModel) {
			reason = runs.InvalidModel
		}
		d := fail(reason, false, "the data check refused the run: %s", firstLine(o.Check.Message))
		d.Check = o.Check
		return d
	}
	jobName := names.RayJob(r.RunID, r.Attempt)
	if o.Job == nil {
		// Submit creates the check's RayJob on the provisioned message:
		// a lost message, or a lost RayJob, is sent again.
		if o.Sweep && o.Now.Sub(r.UpdatedAt) > lostJob {
			return Decision{Action: Resend, Topic: wiring.TopicProvisioned}
		}
		return Decision{Action: Wait}
	}
	st := o.Job.Status
	if rayv1.IsJobDeploymentTerminal(st.JobDeploymentStatus) || st.JobDeploymentStatus == rayv1.JobDeploymentStatusValidationFailed {
		why := fmt.Sprintf("the data check's RayJob %s ended %s/%s without a verdict", jobName, st.JobDeploymentStatus, st.JobStatus)
		if st.Reason != "" || st.Message != "" {
			why += fmt.Sprintf(" (%s: %s)", st.Reason, firstLine(st.Message))
		}
		return fail(runs.DataCheckFailed, false, "%s", why)
	}
	return Decision{Action: Wait}
}

// checked records the data check's figures and starts the first attempt:
// the worker group scales up only now.
func (h *Handler) checked(ctx context.Context, rec *runs.Record) error {
	bucket, prefix := manifests.Storage(rec.Spec, rec.RunID)
	found, err := checkpoints.ReadDataCheck(ctx, h.Deps.Objects.Bucket(bucket), prefix)
	if err != nil {
		return err
	}
	if err := h.note(ctx, rec.RunID, func(r *runs.Record) bool { return r.NoteCheck(found, h.Deps.Time()) }); err != nil {
		return err
	}
	h.Deps.Log.Info("data_check_passed", "run_id", rec.RunID)
	return h.Deps.StartAttempt(ctx, rec.RunID, 1, "", "")
}
