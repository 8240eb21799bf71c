package pipeline

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/raydrop/raydrop/pkg/kubetest"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestPlaceWorkersOnARealAPIServer: a tier move names in workersToDelete
// only the pods still pending when the RayCluster is written (one that
// started since the monitor listed them stays), replaces the list of the
// move before rather than adding to it, and the next attempt's start
// clears it (KubeRay deletes what the list names on every reconcile and
// never clears it itself).
func TestPlaceWorkersOnARealAPIServer(t *testing.T) {
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop API server: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	d := &Deps{Kube: kube.CoreV1(), Ray: rayclient.NewForConfigOrDie(env.Config)}

	data, err := os.ReadFile("../spec/testdata/good/capacity-tiers.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	code, err := manifests.TrainerCode()
	if err != nil {
		t.Fatal(err)
	}
	rc := manifests.RayCluster(s, code, 0)
	if err := d.EnsureCluster(ctx, rc); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, phase corev1.PodPhase) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rc.Namespace, Labels: map[string]string{
				names.LabelRayCluster: rc.Name, names.LabelRayNodeType: string(rayv1.WorkerNode),
			}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-worker", Image: "rayproject/ray"}}},
		}
		p, err := kube.CoreV1().Pods(rc.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		if _, err := kube.CoreV1().Pods(rc.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	toDelete := func() []string {
		t.Helper()
		cur, err := d.Ray.RayV1().RayClusters(rc.Namespace).Get(ctx, rc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cur.Spec.WorkerGroupSpecs[0].ScaleStrategy.WorkersToDelete
	}

	// The monitor listed w-a and w-b pending; w-b has started since.
	pod("w-a", corev1.PodPending)
	pod("w-b", corev1.PodRunning)
	if err := d.PlaceWorkers(ctx, manifests.RayCluster(s, code, 1), []string{"w-a", "w-b"}); err != nil {
		t.Fatal(err)
	}
	if got := toDelete(); !slices.Equal(got, []string{"w-a"}) {
		t.Errorf("after the first move workersToDelete is %q, want [w-a] (w-b runs)", got)
	}
	// KubeRay deleted w-a; its replacement w-c waits too: the next move
	// names it alone.
	if err := kube.CoreV1().Pods(rc.Namespace).Delete(ctx, "w-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod("w-c", corev1.PodPending)
	if err := d.PlaceWorkers(ctx, manifests.RayCluster(s, code, 2), []string{"w-c"}); err != nil {
		t.Fatal(err)
	}
	if got := toDelete(); !slices.Equal(got, []string{"w-c"}) {
		t.Errorf("after the second move workersToDelete is %q, want [w-c] alone", got)
	}
	// The next attempt starts on the first tier: the list is cleared.
	if err := d.EnsureCluster(ctx, manifests.RayCluster(s, code, 0)); err != nil {
		t.Fatal(err)
	}
	if got := toDelete(); len(got) != 0 {
		t.Errorf("after the next attempt's start workersToDelete is %q, want empty", got)
	}
}
