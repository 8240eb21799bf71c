package monitor

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Workers is what the worker pods of a run's cluster show.
type Workers struct {
	Need    int // worker pods the attempt needs running
	Running int // worker pods running and not being deleted
	// ServedOn is the highest capacity tier (an index into the spec's
	// Tiers) a running worker's node selector asks for, -1 when none
	// matches a tier: pods that started on an earlier tier keep running
	// when the worker group moves on, so a retry or the next run may start
	// on nodes of any tier.
	ServedOn int
	// Pending is why a pending worker pod waits (the scheduler's
	// PodScheduled message), "" when none does; PendingPods names every
	// pending one.
	Pending     string
	PendingPods []string
	// Disrupted is every worker pod Kubernetes marked as disrupted (the
	// DisruptionTarget condition) or that a node shutdown terminated, as
	// "pod: reason".
	Disrupted []string
	// Startup is how the running workers came up, once every worker the
	// attempt needs runs and each pod says when it was scheduled and its
	// containers started; nil before.
	Startup *runs.Startup
}

// capacity judges an attempt whose workers do not all run yet: after its
// tier's wait it moves to the next tier; the last tier waits until the
// start deadline.
func capacity(o Observation, a *runs.Attempt) Decision {
	w := o.Workers
	why := fmt.Sprintf("waiting for capacity: %d of %d workers running", w.Running, w.Need)
	tiers := o.Run.Spec.Tiers()
	if a.Tier < len(tiers) {
		t := tiers[a.Tier]
		why = fmt.Sprintf("waiting for capacity on tier %d (%s): %d of %d workers running", a.Tier+1, t.Name(), w.Running, w.Need)
		if a.Tier+1 < len(tiers) && o.Now.Sub(a.Since()) >= time.Duration(t.Wait) {
			return Decision{Action: NextTier, Pending: w.PendingPods, Why: fmt.Sprintf("%s gave %d of %d workers in %s", t.Name(), w.Running, w.Need, time.Duration(t.Wait))}
		}
	}
	if w.Pending != "" {
		why += "; " + firstLine(w.Pending)
	}
	return Decision{Action: Wait, Why: why}
}

// newEvidence is the preemption evidence the observation shows that the
// attempt's record lacks.
func newEvidence(a *runs.Attempt, o Observation) []string {
	var seen []string
	if o.Workers != nil {
		seen = append(seen, o.Workers.Disrupted...)
	}
	switch {
	case o.Mark == nil:
	case o.Mark.Status == checkpoints.MarkPreempted:
		seen = append(seen, "trainer: checkpointed on a preemption notice")
	case o.Mark.NoticeSeen:
		seen = append(seen, "trainer: a preemption notice came before it failed")
	}
	var out []string
	for _, s := range seen {
		if !slices.Contains(a.Preemptions, s) {
			out = append(out, s)
		}
	}
	return out
}

// preempted reports whether the attempt was lost to preemption: evidence
// of it recorded before, or seen now.
func preempted(a *runs.Attempt, evidence []string) bool {
	return len(a.Preemptions) > 0 || len(evidence) > 0
}

func withEvidence(d Decision, evidence []string) Decision {
	d.Preempted = evidence
	return d
}

// disruption is why Kubernetes took the pod's node away, and when when it
// says, "" when it did not: the DisruptionTarget condition it sets before a pod is deleted or
// terminated for a reason outside the pod
// (https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions:
// TerminationByKubelet for a graceful node shutdown, which is how GKE
// stops the pods of a reclaimed Spot VM,
// https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms), or
// the Failed phase with reason Terminated or NodeShutdown the kubelet gives
// pods on a node shutting down
// (https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/).
func disruption(p *corev1.Pod) (reason string, at time.Time) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return c.Reason, c.LastTransitionTime.Time
		}
	}
	if p.Status.Phase == corev1.PodFailed && (p.Status.Reason == "Terminated" || p.Status.Reason == "NodeShutdown") {
		return p.Status.Reason, time.Time{}
	}
	return "", time.Time{}
}

// started is d with the tier the workers run on and how they came up, for
// an attempt not yet recorded running (ServedOn -1 otherwise).
func started(o Observation, a *runs.Attempt, d Decision) Decision {
	d.ServedOn = -1
	if a.RunningAt == nil && o.Workers != nil {
		d.ServedOn, d.Startup = o.Workers.ServedOn, o.Workers.Startup
	}
	return d
}
