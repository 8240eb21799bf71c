package kubesim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/kubetest"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestAdmissionRefusesOversizedWorkers: a worker pod that asks for more
// ephemeral storage than its node class allows is refused by the API
// server, as Autopilot's admission refuses it; KubeRay then records
// FailedToCreateWorkerPod on the RayCluster, with the refusal, in an event
// and in its ReplicaFailure condition (which the monitor reads), and no
// worker pod exists. The head, which asks for no GPU, is created.
func TestAdmissionRefusesOversizedWorkers(t *testing.T) {
	s := exampleSpec(t, "admission")
	s.Cluster.Workers.Scratch = "20Ti" // more than any class allows; Validate would refuse it
	rc := createCluster(t, s)
	ctx := context.Background()
	var why string
	waitFor(t, "the RayCluster's ReplicaFailure condition", 30*time.Second, func() (bool, error) {
		cur := &rayv1.RayCluster{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: rc.Namespace, Name: rc.Name}, cur); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, string(rayv1.RayClusterReplicaFailure))
		if c == nil || c.Reason != "FailedCreateWorkerPod" {
			return false, nil
		}
		why = c.Message
		return true, nil
	})
	if !strings.Contains(why, kubetest.AutopilotRefusal) || !strings.Contains(why, "nvidia-b200 nodes with ephemeral storage on local SSD") {
		t.Errorf("ReplicaFailure message %q does not carry the policy's refusal", why)
	}
	waitFor(t, "the FailedToCreateWorkerPod event", 30*time.Second, func() (bool, error) {
		evs := &corev1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(rc.Namespace)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "RayCluster" && e.InvolvedObject.Name == rc.Name && e.Reason == string(utils.FailedToCreateWorkerPod) && strings.Contains(e.Message, kubetest.AutopilotRefusal) {
				return true, nil
			}
		}
		return false, nil
	})
	if pods := listPods(t, rc.Name, string(rayv1.WorkerNode)); len(pods) != 0 {
		t.Errorf("%d worker pods exist", len(pods))
	}
	if pods := listPods(t, rc.Name, string(rayv1.HeadNode)); len(pods) != 1 {
		t.Errorf("%d head pods, want 1", len(pods))
	}
	if err := k8s.Delete(ctx, rc); err != nil {
		t.Error(err)
	}
}

// TestTierOf: the stand-in reads a pod's tier as the monitor does, from
// the keys that tell tiers apart, whatever keys admission added.
func TestTierOf(t *testing.T) {
	s := exampleSpec(t, "tiers")
	s.Cluster.Capacity = []spec.Tier{
		{Type: spec.TierReservation, Project: "central-gpu-pool", Wait: spec.Duration(time.Minute)},
		{Type: spec.TierFlexStart, Wait: spec.Duration(time.Minute)},
		{Type: spec.TierSpot},
	}
	added := map[string]string{"cloud.google.com/compute-class": "Accelerator", "kubernetes.io/arch": "amd64"}
	for i, tier := range s.Tiers() {
		sel, _ := manifests.WorkerPlacement(s, i)
		for k, v := range added {
			sel[k] = v
		}
		if got := kubesim.TierOf(sel); got != tier.Type {
			t.Errorf("tier %d (%s) with keys GKE added: TierOf %s", i, tier.Name(), got)
		}
		if i == 0 && sel[names.NodeReservationProject] != "central-gpu-pool" {
			t.Errorf("the shared reservation's selector %v lacks its project", sel)
		}
	}
}
