package kueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/infra/localcloud/kueue"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/spec"
)

func gvr(resource, version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: version, Resource: resource}
}

const ns = "team-a"

// TestKueueAdmitsAPerRunRayJob runs the real Kueue against the local
// cloud's API server, with KubeRay's reconcilers: a per-run RayJob (the
// run's own RayCluster embedded, shut down when the job ends) created
// suspended in a LocalQueue is admitted within the ClusterQueue's quota
// and unsuspended, and KubeRay creates its cluster; a second one that the
// quota cannot hold waits suspended, its Workload saying why, until the
// first is gone. Kueue's webhooks answer over TLS (a RayJob Kueue cannot
// manage is refused), and so does its conversion webhook (a ClusterQueue
// read at v1beta1).
func TestKueueAdmitsAPerRunRayJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The first run trains until it is deleted: its quota stays held.
	sim, err := kubesim.Start(ctx, kubesim.Options{Log: log, Kueue: true, Scenario: func(_ context.Context, job *rayv1.RayJob) kubesim.Scenario {
		sc := kubesim.DefaultScenario()
		if strings.HasPrefix(job.Name, "first") {
			sc.StepTime = time.Hour
		}
		return sc
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Stop() })
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := sim.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	k, err := kueue.Start(ctx, kueue.Options{Config: sim.Config, Kubeconfig: kubeconfig, Dir: filepath.Join(dir, "kueue"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(k.LogPath)
			t.Logf("kueue's log:\n%s", b)
		}
	})
	// Kueue's own objects' webhooks (ClusterQueue, Cohort, ResourceFlavor,
	// Workload) and the RayJob's, mutating and validating.
	if k.Webhooks != 9 {
		t.Errorf("%d webhooks installed, want 9", k.Webhooks)
	}
	dyn := dynamic.NewForConfigOrDie(sim.Config)
	if err := sim.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	create := func(r schema.GroupVersionResource, namespace string, obj map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion("kueue.x-k8s.io/v1beta2")
		var err error
		if namespace == "" {
			_, err = dyn.Resource(r).Create(ctx, u, metav1.CreateOptions{})
		} else {
			_, err = dyn.Resource(r).Namespace(namespace).Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("create %s: %v", r.Resource, err)
		}
	}
	create(gvr("resourceflavors", "v1beta2"), "", map[string]any{"kind": "ResourceFlavor", "metadata": map[string]any{"name": "reservation"}})
	quota := func(name, q string) map[string]any { return map[string]any{"name": name, "nominalQuota": q} }
	create(gvr("clusterqueues", "v1beta2"), "", map[string]any{"kind": "ClusterQueue", "metadata": map[string]any{"name": ns},
		"spec": map[string]any{"namespaceSelector": map[string]any{}, "resourceGroups": []any{map[string]any{
			"coveredResources": []any{"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"},
			"flavors": []any{map[string]any{"name": "reservation", "resources": []any{
				quota("cpu", "1000"), quota("memory", "10Ti"), quota("ephemeral-storage", "10Ti"), quota("nvidia.com/gpu", "16"),
			}}},
		}}}})
	create(gvr("localqueues", "v1beta2"), ns, map[string]any{"kind": "LocalQueue", "metadata": map[string]any{"name": ns, "namespace": ns},
		"spec": map[string]any{"clusterQueue": ns}})

	// The conversion webhook: the API server converts the stored v1beta2
	// ClusterQueue to v1beta1 through Kueue.
	if _, err := dyn.Resource(gvr("clusterqueues", "v1beta1")).Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Errorf("read the ClusterQueue at v1beta1 (conversion webhook): %v", err)
	}

	code, err := manifests.TrainerCode()
	if err != nil {
		t.Fatal(err)
	}
	// Kueue's validating webhook refuses a queued RayJob whose cluster
	// outlives it.
	lingering := perRun(t, "lingering", code)
	lingering.Spec.ShutdownAfterJobFinishes = false
	if err := sim.Client.Create(ctx, lingering); err == nil || !strings.Contains(err.Error(), "shutdownAfterJobFinishes") {
		t.Errorf("a queued RayJob without shutdownAfterJobFinishes: %v, want Kueue's webhook to refuse it", err)
	}

	first, second := perRun(t, "first", code), perRun(t, "second", code)
	if err := sim.Client.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the first RayJob admitted and unsuspended, its RayCluster created", func() (bool, string) {
		j := &rayv1.RayJob{}
		if err := sim.Client.Get(ctx, client.ObjectKeyFromObject(first), j); err != nil {
			return false, err.Error()
		}
		wl := workloadOf(ctx, t, dyn, first.Name)
		return !j.Spec.Suspend && j.Status.RayClusterName != "" && condition(wl, "Admitted") == "True",
			fmt.Sprintf("suspend %v, cluster %q, workload %s", j.Spec.Suspend, j.Status.RayClusterName, conditions(wl))
	})
	if err := sim.Client.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the second RayJob waiting for quota, suspended", func() (bool, string) {
		wl := workloadOf(ctx, t, dyn, second.Name)
		msg := message(wl, "QuotaReserved")
		j := &rayv1.RayJob{}
		_ = sim.Client.Get(ctx, client.ObjectKeyFromObject(first), j)
		return condition(wl, "QuotaReserved") == "False" && strings.Contains(msg, "nvidia.com/gpu"),
			fmt.Sprintf("%s; the first: %s %s %q, %s", conditions(wl), j.Status.JobDeploymentStatus, j.Status.JobStatus, j.Status.Message, conditions(workloadOf(ctx, t, dyn, first.Name)))
	})
	// KubeRay names the cluster of a suspended RayJob in its status, and
	// creates none.
	j := &rayv1.RayJob{}
	if err := sim.Client.Get(ctx, client.ObjectKeyFromObject(second), j); err != nil || !j.Spec.Suspend {
		t.Errorf("the second RayJob: suspend %v (%v); want suspended", j.Spec.Suspend, err)
	}
	clusters := &rayv1.RayClusterList{}
	if err := sim.Client.List(ctx, clusters, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters.Items {
		if metav1.IsControlledBy(&c, j) {
			t.Errorf("the suspended second RayJob has a RayCluster, %s", c.Name)
		}
	}

	if err := sim.Client.Delete(ctx, first, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the second RayJob admitted once the first is gone", func() (bool, string) {
		j := &rayv1.RayJob{}
		if err := sim.Client.Get(ctx, client.ObjectKeyFromObject(second), j); err != nil {
			return false, err.Error()
		}
		wl := workloadOf(ctx, t, dyn, second.Name)
		return !j.Spec.Suspend && condition(wl, "Admitted") == "True", fmt.Sprintf("suspend %v, workload %s", j.Spec.Suspend, conditions(wl))
	})
}

// perRun is a run's RayJob as it goes to Kueue (manifests.QueuedRayJob):
// the default spec's, in the team's LocalQueue.
func perRun(t *testing.T, id string, code manifests.Code) *rayv1.RayJob {
	t.Helper()
	s := spec.Defaults()
	s.Name, s.Cluster.Namespace, s.Output.Bucket = id, ns, "out"
	return manifests.QueuedRayJob(&s, manifests.Run{ID: id, Attempt: 1}, code, ns, "")
}

// workloadOf is the Workload Kueue made for a RayJob (nil before it has).
func workloadOf(ctx context.Context, t *testing.T, dyn dynamic.Interface, job string) *unstructured.Unstructured {
	t.Helper()
	list, err := dyn.Resource(gvr("workloads", "v1beta2")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("list workloads: %v", err)
	}
	if list == nil {
		return nil
	}
	for i, wl := range list.Items {
		for _, o := range wl.GetOwnerReferences() {
			if o.Kind == "RayJob" && o.Name == job {
				return &list.Items[i]
			}
		}
	}
	return nil
}

func conditionField(wl *unstructured.Unstructured, typ, field string) string {
	if wl == nil {
		return ""
	}
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			v, _ := m[field].(string)
			return v
		}
	}
	return ""
}

func condition(wl *unstructured.Unstructured, typ string) string {
	return conditionField(wl, typ, "status")
}

func message(wl *unstructured.Unstructured, typ string) string {
	return conditionField(wl, typ, "message")
}

// conditions says a Workload's conditions, for a failure's message.
func conditions(wl *unstructured.Unstructured) string {
	if wl == nil {
		return "none yet"
	}
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	var out []string
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok {
			out = append(out, fmt.Sprintf("%v=%v (%v: %v)", m["type"], m["status"], m["reason"], m["message"]))
		}
	}
	return wl.GetName() + ": " + strings.Join(out, "; ")
}

// waitFor polls until ok, failing the test with the last state after
// 2 min.
func waitFor(ctx context.Context, t *testing.T, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done, state := ok()
		if done {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within 2 min: %s", what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
