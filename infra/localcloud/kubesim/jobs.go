package kubesim

import (
	"context"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const jobPoll = 200 * time.Millisecond

// jobController drives KubeRay's submitter Jobs. When a submitter Job
// appears, its pod would run `ray job submit`: the Ray job is submitted
// (its play starts) and the Job becomes active. The Job ends the way the
// submitter's `ray job logs --follow` would exit:
//
//   - SUCCEEDED, STOPPED: exit 0, the Job is Complete;
//   - FAILED: exit 1 on every try, the Job is Failed (backoff limit
//     reached), but only once the RayJob has recorded the terminal job
//     status: `ray job submit` exits after the job ended, while KubeRay
//     polls the dashboard every few seconds, and a Failed Job seen first
//     would make it report SubmissionFailed instead of AppFailed;
//   - head lost: the log stream closes and the command exits 0, the Job is
//     Complete (what KubeRay v1.5.0 users see after a head restart).
//
// Its pod is created as the Job controller creates it (one pod plays every
// try of the backoff limit) and run by the kubelet stand-in; its log holds
// what `ray job submit` prints: the submission, the driver's output as the
// play writes it, then the job's end (submitter.go).
type jobController struct {
	client.Client
	dash *dashboard
	logs *containerLogs

	mu   sync.Mutex
	subs map[types.UID]*submitter
}

func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func submissionID(j *batchv1.Job) string {
	for _, c := range j.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == utils.RAY_JOB_SUBMISSION_ID {
				return e.Value
			}
		}
	}
	return ""
}

func (c *jobController) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &batchv1.Job{}
	if err := c.Get(ctx, req.NamespacedName, job); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	id := submissionID(job)
	if job.DeletionTimestamp != nil || jobFinished(job) || id == "" {
		return ctrl.Result{}, nil
	}
	p := c.dash.submit(job, id)
	if p == nil {
		return ctrl.Result{}, nil // shutting down
	}
	sub, err := c.submitterPod(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := metav1.Now()
	if job.Status.StartTime == nil {
		job.Status.StartTime = &now
		job.Status.Active = 1
		job.Status.Ready = ptr.To[int32](1)
		job.Status.Terminating = ptr.To[int32](0)
		return ctrl.Result{RequeueAfter: jobPoll}, client.IgnoreNotFound(c.Status().Update(ctx, job))
	}
	st := p.snapshot().Status
	switch st {
	case rayv1.JobStatusSucceeded, rayv1.JobStatusStopped, JobStatusLost:
	case rayv1.JobStatusFailed:
		if owner := metav1.GetControllerOf(job); owner != nil && owner.Kind == "RayJob" {
			rj := &rayv1.RayJob{}
			err := c.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: owner.Name}, rj)
			if err == nil && rj.UID == owner.UID && !rayv1.IsJobTerminal(rj.Status.JobStatus) && rj.DeletionTimestamp == nil {
				return ctrl.Result{RequeueAfter: jobPoll}, c.tail(ctx, job, sub, p)
			}
		}
	default:
		return ctrl.Result{RequeueAfter: jobPoll}, c.tail(ctx, job, sub, p)
	}
	if done, err := c.exit(ctx, job, sub, p); err != nil || !done {
		return ctrl.Result{RequeueAfter: jobPoll}, err
	}

	cond := func(t batchv1.JobConditionType, reason, msg string) batchv1.JobCondition {
		return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastProbeTime: now, LastTransitionTime: now}
	}
	job.Status.Active = 0
	job.Status.Ready = ptr.To[int32](0)
	if st == rayv1.JobStatusFailed {
		job.Status.Failed = 1 + ptr.Deref(job.Spec.BackoffLimit, 0)
		job.Status.Conditions = append(job.Status.Conditions,
			cond(batchv1.JobFailureTarget, "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
			cond(batchv1.JobFailed, "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
	} else {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &now
		job.Status.Conditions = append(job.Status.Conditions,
			cond(batchv1.JobSuccessCriteriaMet, "CompletionsReached", "Reached expected number of succeeded pods"),
			cond(batchv1.JobComplete, "CompletionsReached", "Reached expected number of succeeded pods"))
	}
	if err := c.Status().Update(ctx, job); err != nil {
		return ctrl.Result{RequeueAfter: jobPoll}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}
