package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestFailedHeadKept: a run that fails with debug.keepFailedFor keeps its
// Ray head pod for that long (its GPU workers go to zero at once), says so
// in raydrop status, and holds its cluster: the run queued behind it waits.
// Then the monitor deletes the head pod (KubeRay starts a fresh one) and
// passes the cluster on, and the queued run succeeds.
func TestFailedHeadKept(t *testing.T) {
	t.Parallel()
	const cluster = "e2e-keephead"
	keep := 20 * time.Second
	a := upload(t, "keephead-a", specFor(t, cluster, map[string]any{"debug": map[string]any{"keepFailedFor": keep.String()}}), "outcome=fail,at=2,step=200ms")
	waitPhase(t, a, 60*time.Second, runs.Submitted, runs.Running, runs.Failed)
	b := upload(t, "keephead-b", specFor(t, cluster, nil), "steps=2,step=200ms")

	ra := waitPhase(t, a, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	k := ra.HeadKept
	if ra.Phase != runs.Failed || k == nil || !strings.HasPrefix(k.Pod, cluster+"-head-") || k.Until.Sub(ra.Times[runs.Failed]) != keep || k.ReleasedAt != nil {
		t.Fatalf("run %s %s, head kept %+v; want FAILED with its head kept %s", a, ra.Phase, k, keep)
	}
	if code, out, _ := raydrop("status", a); code != 0 || !strings.Contains(out, "kept for a look until") || !strings.Contains(out, "port-forward pod/"+k.Pod+" 8265") {
		t.Errorf("status: exit %d, no kept head:\n%s", code, out)
	}
	// The GPU workers go, the head stays, the next run waits.
	waitNoWorkers(t, cluster)
	if _, err := kube.CoreV1().Pods("default").Get(context.Background(), k.Pod, metav1.GetOptions{}); err != nil {
		t.Errorf("the kept head pod %s: %v", k.Pod, err)
	}
	if rb, err := probe.Runs(st).Get(context.Background(), b); err != nil || rb.Phase != runs.Queued || time.Now().After(k.Until) {
		t.Errorf("run %s is %v (%v) before %s; want QUEUED while the head is kept", b, rb.Phase, err, k.Until)
	}

	rb := waitPhase(t, b, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if rb.Phase != runs.Succeeded {
		t.Fatalf("run %s %s (%s), want SUCCEEDED after the kept head", b, rb.Phase, rb.Message)
	}
	if p := rb.Times[runs.Provisioned]; p.Before(k.Until) {
		t.Errorf("run %s provisioned at %s, before the head was released at %s", b, p, k.Until)
	}
	ra, err := probe.Runs(st).Get(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	if ra.HeadKept.ReleasedAt == nil || ra.HeadKept.ReleasedAt.Before(k.Until) {
		t.Errorf("head kept %+v: not released, or released early", ra.HeadKept)
	}
	if _, err := kube.CoreV1().Pods("default").Get(context.Background(), k.Pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the kept head pod %s after its time: %v, want deleted", k.Pod, err)
	}
	if code, out, _ := raydrop("status", a); code != 0 || !strings.Contains(out, "was kept for a look until") {
		t.Errorf("status after the release: exit %d:\n%s", code, out)
	}
	waitNoWorkers(t, cluster)
}
