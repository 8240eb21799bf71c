package kubesim

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// submitter is a submitter Job's pod and how far its `ray job submit` has
// printed.
type submitter struct {
	pod     string
	header  bool // the submission's lines are printed
	printed int  // the driver's lines copied so far
	exited  bool
}

// submitterPod creates the Job's pod as the Job controller does (its
// template, the Job's labels, the Job as its controller), once.
func (c *jobController) submitterPod(ctx context.Context, job *batchv1.Job) (*submitter, error) {
	c.mu.Lock()
	sub := c.subs[job.UID]
	if sub == nil {
		sum := sha256.Sum256([]byte(job.UID))
		sub = &submitter{pod: fmt.Sprintf("%s-%x", job.Name, sum[:3])}
		c.subs[job.UID] = sub
	}
	c.mu.Unlock()
	labels := map[string]string{}
	for k, v := range job.Spec.Template.Labels {
		labels[k] = v
	}
	for _, k := range []string{"batch.kubernetes.io/controller-uid", "controller-uid"} {
		labels[k] = string(job.UID)
	}
	for _, k := range []string{"batch.kubernetes.io/job-name", "job-name"} {
		labels[k] = job.Name
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: job.Namespace, Name: sub.pod, Labels: labels, Annotations: job.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *job.Spec.Template.Spec.DeepCopy(),
	}
	if err := c.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kubesim: create submitter pod %s/%s: %w", job.Namespace, sub.pod, err)
	}
	return sub, nil
}

// running is the submitter pod and its container's ID while it runs.
func (c *jobController) running(ctx context.Context, job *batchv1.Job, sub *submitter) (*corev1.Pod, string) {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: sub.pod}, pod); err != nil {
		return nil, ""
	}
	if len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
		return pod, ""
	}
	return pod, pod.Status.ContainerStatuses[0].ContainerID
}

// tail prints into the running submitter's log what `ray job submit` has
// to say so far: the submission, then the driver's new lines.
func (c *jobController) tail(ctx context.Context, job *batchv1.Job, sub *submitter, p *play) error {
	_, id := c.running(ctx, job, sub)
	if id == "" || sub.exited {
		return nil
	}
	if !sub.header {
		if err := c.logs.write(id, "stdout", submitHeader(submitAddress(job), p.id, time.Now())); err != nil {
			return err
		}
		sub.header = true
	}
	lines := p.outputFrom(sub.printed)
	if len(lines) == 0 {
		return nil
	}
	if err := c.logs.write(id, "stdout", strings.Join(lines, "\n")); err != nil {
		return err
	}
	sub.printed += len(lines)
	return nil
}

// exit ends the submitter once the job has: the rest of the driver's
// output and the job's end printed, the container exited (1 for a failed
// job, as `ray job submit` exits), the pod Succeeded or Failed. It reports
// false while the pod has not started yet; a pod that is gone has nothing
// to end.
func (c *jobController) exit(ctx context.Context, job *batchv1.Job, sub *submitter, p *play) (bool, error) {
	if sub.exited {
		return true, nil
	}
	pod, id := c.running(ctx, job, sub)
	if pod == nil {
		return true, nil
	}
	if id == "" {
		return pod.DeletionTimestamp != nil, nil
	}
	if err := c.tail(ctx, job, sub, p); err != nil {
		return false, err
	}
	r := p.snapshot()
	st := r.Status
	if st == JobStatusLost {
		st = "" // the head went: the log stream closes, and nothing more is printed
	}
	if err := c.logs.write(id, "stdout", submitFooter(p.id, st, p.failMessage(), time.Now())); err != nil && st != "" {
		return false, err
	}
	code, reason, phase := int32(0), "Completed", corev1.PodSucceeded
	if r.Status == rayv1.JobStatusFailed {
		code, reason, phase = 1, "Error", corev1.PodFailed
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), cur); err != nil {
			return err
		}
		now := metav1.Now()
		for i := range cur.Status.ContainerStatuses {
			cs := &cur.Status.ContainerStatuses[i]
			if cs.State.Running == nil {
				continue
			}
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: code, Reason: reason, StartedAt: cs.State.Running.StartedAt, FinishedAt: now, ContainerID: cs.ContainerID,
			}}
			cs.Ready, cs.Started = false, ptr.To(false)
		}
		cur.Status.Phase = phase
		for i := range cur.Status.Conditions {
			if t := cur.Status.Conditions[i].Type; t == corev1.PodReady || t == corev1.ContainersReady {
				cur.Status.Conditions[i].Status, cur.Status.Conditions[i].Reason, cur.Status.Conditions[i].LastTransitionTime = corev1.ConditionFalse, "PodCompleted", now
			}
		}
		return c.Status().Update(ctx, cur)
	})
	if err != nil {
		return false, client.IgnoreNotFound(err)
	}
	c.logs.stop(id)
	sub.exited = true
	return true, nil
}

// submitAddress is the dashboard address the submitter's command names
// (--address), as `ray job submit` prints it.
func submitAddress(job *batchv1.Job) string {
	for _, ctr := range job.Spec.Template.Spec.Containers {
		words := append(append([]string{}, ctr.Command...), ctr.Args...)
		for i, w := range words {
			for _, f := range strings.Fields(w) {
				if v, ok := strings.CutPrefix(f, "--address="); ok {
					return v
				}
			}
			if w == "--address" && i+1 < len(words) {
				return words[i+1]
			}
			fs := strings.Fields(w)
			for j := range fs {
				if fs[j] == "--address" && j+1 < len(fs) {
					return fs[j+1]
				}
			}
		}
	}
	return "http://127.0.0.1:8265"
}
