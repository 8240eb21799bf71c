package monitor

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestDisruption: what Kubernetes records on a pod whose node is taken
// away counts as preemption; a pod that merely failed or is pending does
// not.
func TestDisruption(t *testing.T) {
	cond := func(ty corev1.PodConditionType, st corev1.ConditionStatus, reason string) corev1.PodCondition {
		return corev1.PodCondition{Type: ty, Status: st, Reason: reason}
	}
	cases := []struct {
		name string
		st   corev1.PodStatus
		want string
	}{
		{"graceful node shutdown", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Terminated", Conditions: []corev1.PodCondition{cond(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet")}}, "TerminationByKubelet"},
		{"deleted with its node", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond(corev1.DisruptionTarget, corev1.ConditionTrue, "DeletionByPodGC")}}, "DeletionByPodGC"},
		{"terminated, no condition", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Terminated"}, "Terminated"},
		{"refused by a node shutting down", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "NodeShutdown"}, "NodeShutdown"},
		{"condition withdrawn", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond(corev1.DisruptionTarget, corev1.ConditionFalse, "PreemptionByScheduler")}}, ""},
		{"failed by its own code", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Error"}, ""},
		{"pending", corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{cond(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable")}}, ""},
	}
	for _, c := range cases {
		if got, _ := disruption(&corev1.Pod{Status: c.st}); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
