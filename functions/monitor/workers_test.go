package monitor

import (
	"context"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestWorkersServedOn: a running worker pod counts for the tier whose
// placement it carries even when GKE added node selector keys at
// admission, and for no tier when it asks for other nodes.
func TestWorkersServedOn(t *testing.T) {
	r := tiered(runs.Submitted, 2) // reservation b200, flexStart, spot
	r.Namespace, r.Cluster = "default", "c"
	added := map[string]string{"cloud.google.com/compute-class": "Accelerator", "kubernetes.io/arch": "amd64", spec.NodeEphemeralLocalSSD: "true"}
	placed := func(tier int, extra map[string]string) map[string]string {
		sel, _ := manifests.WorkerPlacement(r.Spec, tier)
		maps.Copy(sel, extra)
		return sel
	}
	cases := []struct {
		name string
		sels []map[string]string
		want int
	}{
		{"reservation as rendered", []map[string]string{placed(0, nil)}, 0},
		{"reservation with keys GKE added", []map[string]string{placed(0, added)}, 0},
		{"flexStart with keys GKE added", []map[string]string{placed(1, added)}, 1},
		{"spot with keys GKE added", []map[string]string{placed(2, added)}, 2},
		{"one on reservation, one on spot", []map[string]string{placed(0, added), placed(2, added)}, 2},
		{"another reservation", []map[string]string{placed(0, map[string]string{names.NodeReservation: "elsewhere"})}, -1},
		{"a reservation of another project", []map[string]string{placed(0, map[string]string{names.NodeReservationProject: "central-gpus"})}, -1},
		{"on-demand, not a tier of this spec", []map[string]string{{names.NodeAccelerator: "nvidia-b200"}}, -1},
	}
	for _, c := range cases {
		var pods []corev1.Pod
		for i, sel := range c.sels {
			pods = append(pods, corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "w" + string(rune('0'+i))},
				Spec:       corev1.PodSpec{NodeSelector: sel},
				Status:     corev1.PodStatus{Phase: corev1.PodRunning},
			})
		}
		h := &Handler{}
		w, err := h.workers(context.Background(), r, &listing{workers: map[string][]corev1.Pod{"default/c": pods}})
		if err != nil {
			t.Fatal(err)
		}
		if w.ServedOn != c.want || w.Running != len(pods) {
			t.Errorf("%s: served on %d with %d running, want %d", c.name, w.ServedOn, w.Running, c.want)
		}
	}
}

// TestWorkerPodRefusal: the RayCluster's ReplicaFailure condition, as
// KubeRay writes it when the API server refuses a worker pod, becomes one
// line that names KubeRay's event and keeps the API server's reason.
func TestWorkerPodRefusal(t *testing.T) {
	refused := `pods "c-gpu-group-worker-x7k2p" is forbidden: ValidatingAdmissionPolicy 'raydrop-autopilot-ephemeral-storage' with binding 'raydrop-autopilot-ephemeral-storage' denied request: GKE Autopilot refuses the pod: its containers request 20480Gi of ephemeral storage, more than the 10000Gi allowed on nvidia-b200 nodes with ephemeral storage on local SSD`
	cluster := func(c ...metav1.Condition) *rayv1.RayCluster {
		return &rayv1.RayCluster{Status: rayv1.RayClusterStatus{Conditions: c}}
	}
	cases := []struct {
		name string
		rc   *rayv1.RayCluster
		want string
	}{
		{"no condition", cluster(), ""},
		{"another failure", cluster(metav1.Condition{Type: string(rayv1.RayClusterReplicaFailure), Status: metav1.ConditionTrue, Reason: "FailedDeleteWorkerPod", Message: "x"}), ""},
		{"cleared", cluster(metav1.Condition{Type: string(rayv1.RayClusterReplicaFailure), Status: metav1.ConditionFalse, Reason: failedCreateWorkerPod, Message: "x"}), ""},
		{"refused", cluster(metav1.Condition{Type: string(rayv1.RayClusterReplicaFailure), Status: metav1.ConditionTrue, Reason: failedCreateWorkerPod, Message: failedCreateWorkerPod + "\n" + refused}),
			"worker pods not created (KubeRay FailedToCreateWorkerPod): " + refused},
	}
	for _, c := range cases {
		if got := workerPodRefusal(c.rc); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// The capacity decision carries it into the attempt's waiting reason.
	r := tiered(runs.Submitted, 2)
	d := capacity(Observation{Run: r, Workers: &Workers{Need: 2, Pending: workerPodRefusal(cases[3].rc)}, Now: t0}, r.CurrentAttempt())
	if d.Action != Wait || !strings.Contains(d.Why, "FailedToCreateWorkerPod") || !strings.Contains(d.Why, "GKE Autopilot refuses the pod") {
		t.Errorf("capacity: %+v", d)
	}
}

// TestWorkersStartup: once every worker the attempt needs runs, the
// start-up is when the last was scheduled and the last one's containers
// started; unknown while one is missing or a running pod does not say.
func TestWorkersStartup(t *testing.T) {
	r := tiered(runs.Submitted, 0) // the defaults: 16 workers on nodes of 8 GPUs, two worker pods
	r.Namespace, r.Cluster = "default", "c"
	at := func(s int) metav1.Time { return metav1.NewTime(t0.Add(time.Duration(s) * time.Second)) }
	pod := func(name string, scheduled, started int) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if scheduled >= 0 {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: at(scheduled)}}
		}
		state := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
		if started >= 0 {
			state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(started)}}
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker", State: state}}
		return p
	}
	cases := []struct {
		name string
		pods []corev1.Pod
		want *runs.Startup
	}{
		{"both up: the later of each", []corev1.Pod{pod("w0", 60, 130), pod("w1", 95, 120)},
			&runs.Startup{ScheduledAt: at(95).Time, StartedAt: at(130).Time}},
		{"one of two running", []corev1.Pod{pod("w0", 60, 130)}, nil},
		{"a running pod without its scheduling time", []corev1.Pod{pod("w0", 60, 130), pod("w1", -1, 120)}, nil},
		{"a running pod whose container has not started", []corev1.Pod{pod("w0", 60, 130), pod("w1", 95, -1)}, nil},
	}
	for _, c := range cases {
		w, err := (&Handler{}).workers(context.Background(), r, &listing{workers: map[string][]corev1.Pod{"default/c": c.pods}})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(w.Startup, c.want) {
			t.Errorf("%s: start-up %+v, want %+v", c.name, w.Startup, c.want)
		}
	}
}
