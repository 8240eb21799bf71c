package monitor

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/runs"
)

// TestLostDuring: KubeRay's Event for a worker pod deleted in phase Failed
// is evidence of a lost node for the attempt it happened in, however the
// event correlator wrapped it; a pod deleted for any other reason, or
// before the attempt began, is not.
func TestLostDuring(t *testing.T) {
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	a := &runs.Attempt{N: 2, CreatedAt: start}
	ev := func(reason, kind, msg string, at time.Time) corev1.Event {
		return corev1.Event{
			Reason: reason, Message: msg,
			InvolvedObject: corev1.ObjectReference{Kind: kind, Name: "rc"},
			LastTimestamp:  metav1.NewTime(at), FirstTimestamp: metav1.NewTime(at),
		}
	}
	failed := "Deleted worker Pod default/rc-gpu-abcde; Pod status: Failed; Pod restart policy: Always; Ray container terminated status: nil"
	cases := []struct {
		name string
		e    corev1.Event
		want int
	}{
		{"failed pod during the attempt", ev(reasonDeletedWorkerPod, "RayCluster", failed, start.Add(time.Minute)), 1},
		{"combined by the correlator", ev(reasonDeletedWorkerPod, "RayCluster", "(combined from similar events): "+failed, start.Add(time.Minute)), 1},
		{"an earlier attempt's", ev(reasonDeletedWorkerPod, "RayCluster", failed, start.Add(-time.Second)), 0},
		{"scaled down (workersToDelete)", ev(reasonDeletedWorkerPod, "RayCluster", "Deleted pod default/rc-gpu-abcde", start.Add(time.Minute)), 0},
		{"succeeded pod", ev(reasonDeletedWorkerPod, "RayCluster", "Deleted worker Pod default/rc-gpu-abcde; Pod status: Succeeded; Pod restart policy: Always; Ray container terminated status: nil", start.Add(time.Minute)), 0},
		{"another reason", ev("CreatedWorkerPod", "RayCluster", failed, start.Add(time.Minute)), 0},
		{"on a pod", ev(reasonDeletedWorkerPod, "Pod", failed, start.Add(time.Minute)), 0},
	}
	for _, c := range cases {
		got := lostDuring(a, []corev1.Event{c.e})
		if len(got) != c.want {
			t.Errorf("%s: %q, want %d pieces of evidence", c.name, got, c.want)
		}
		if c.want == 1 && got[0][:len("rc-gpu-abcde:")] != "rc-gpu-abcde:" {
			t.Errorf("%s: %q does not name the pod", c.name, got)
		}
	}
	// The API server of an events.k8s.io/v1 recorder sets EventTime only.
	e := corev1.Event{Reason: reasonDeletedWorkerPod, Message: failed, InvolvedObject: corev1.ObjectReference{Kind: "RayCluster"}, EventTime: metav1.NewMicroTime(start.Add(time.Minute))}
	if got := lostDuring(a, []corev1.Event{e}); len(got) != 1 {
		t.Errorf("an event with EventTime only: %q", got)
	}
}
