package manifests

import (
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/spec"
)

// The labels Kueue reads on a job: the LocalQueue it waits in, and its
// WorkloadPriorityClass.
const (
	LabelQueueName     = "kueue.x-k8s.io/queue-name"
	LabelPriorityClass = "kueue.x-k8s.io/priority-class"
)

// QueuedTTL is how long, in seconds, KubeRay keeps a queued run's RayCluster
// after its job ended before deleting it: the time the attempt's evidence
// (pods, logs, events) has to be kept before its pods go.
const QueuedTTL = 600

// QueuedRayJob is one attempt of the run where Kueue admits runs: the run's
// own RayCluster (RayCluster's spec for the tier, its workers at the spec's
// replicas) embedded in the RayJob rather than chosen by clusterSelector,
// which Kueue skips and KubeRay v1.5.0 refuses to suspend; shut down
// QueuedTTL seconds after the job ends, as Kueue requires
// (shutdownAfterJobFinishes); created suspended, in LocalQueue queue with
// WorkloadPriorityClass priority (none when empty), for Kueue to admit.
func QueuedRayJob(s *spec.JobSpec, run Run, code Code, queue, priority string) *rayv1.RayJob {
	job := RayJob(s, run)
	cluster := RayCluster(s, code, run.Tier)
	job.Spec.ClusterSelector = nil
	job.Spec.RayClusterSpec = &cluster.Spec
	job.Spec.ShutdownAfterJobFinishes = true
	job.Spec.TTLSecondsAfterFinished = QueuedTTL
	job.Spec.Suspend = true
	job.Labels[LabelQueueName] = queue
	if priority != "" {
		job.Labels[LabelPriorityClass] = priority
	}
	return job
}
