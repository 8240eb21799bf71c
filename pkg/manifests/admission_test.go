package manifests_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/raydrop/raydrop/pkg/kubetest"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestAutopilotAdmission sends the worker pod of every model size and GPU
// class raydrop knows, with the default scratch, to a real kube-apiserver
// that checks ephemeral storage as Autopilot does (kubetest.AutopilotPolicy):
// each is admitted, or, where the default does not fit the class, the spec
// is refused first, naming cluster.workers.scratch. A pod asking for more
// than its class allows is refused by the API server with the policy's
// message.
func TestAutopilotAdmission(t *testing.T) {
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
	if err := kubetest.InstallAutopilotPolicy(ctx, env.Config); err != nil {
		t.Fatal(err)
	}
	pods, err := coreclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	create := func(s *spec.JobSpec) error {
		rc := manifests.RayCluster(s, fixedCode, 0)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: metav1.NamespaceDefault},
			Spec:       rc.Spec.WorkerGroupSpecs[0].Template.Spec,
		}
		_, err := pods.Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	models := []string{"google/gemma-3-1b-it", "google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it", "example/unknown-model"}
	for _, accel := range slices.Sorted(maps.Keys(spec.NodeClasses)) {
		for _, model := range models {
			s := exampleSpec(t)
			s.Model.ID = model
			s.Cluster.Workers.Accelerator = accel
			s.Cluster.Capacity = []spec.Tier{{Type: spec.TierReservation}}
			scratch := s.WorkerScratch()
			if err := s.Validate(); err != nil {
				if spec.NodeClassOf(accel).LocalSSD || !strings.Contains(err.Error(), "cluster.workers.scratch: is empty, and the default") {
					t.Errorf("%s on %s: %v", model, accel, err)
				}
				continue
			}
			if err := create(s); err != nil {
				t.Errorf("%s on %s (scratch %s): API server refused the worker pod: %v", model, accel, scratch.String(), err)
			}
		}
		// More than the class allows: the spec refuses it, and so does
		// the API server when it reaches it all the same.
		s := exampleSpec(t)
		s.Cluster.Workers.Accelerator = accel
		s.Cluster.Workers.Scratch = "20Ti"
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "cluster.workers.scratch: \"20Ti\" is more than") {
			t.Errorf("scratch 20Ti on %s: spec validation says %v", accel, err)
		}
		err := create(s)
		if err == nil || !strings.Contains(err.Error(), kubetest.AutopilotRefusal) || !strings.Contains(err.Error(), accel+" nodes") {
			t.Errorf("scratch 20Ti on %s: API server answered %v, want the policy's refusal", accel, err)
		} else if accel == "nvidia-b200" {
			t.Logf("refused as Autopilot would: %v", err)
		}
	}
}
