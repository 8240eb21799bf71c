package kubesim_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/schemas"
)

// kept is an evidence capture's files, as Capture wrote them.
type kept struct {
	manifest *evidence.Manifest
	files    map[string][]byte
}

// memWriter keeps what a capture writes, each name once.
type memWriter struct {
	mu    sync.Mutex
	files map[string][]byte
}

func (w *memWriter) Create(_ context.Context, name string, data []byte, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.files[name]; ok {
		return evidence.ErrExists
	}
	w.files[name] = data
	return nil
}

// captureEvidence captures the evidence of cluster's attempt whose RayJob
// is job through the API server, checks its manifest against its schema
// and against the files written, and returns them.
func captureEvidence(t *testing.T, cs kubernetes.Interface, cluster, job string) *kept {
	t.Helper()
	w := &memWriter{files: map[string][]byte{}}
	target := evidence.Target{RunID: cluster + "-0001", Attempt: 1, Namespace: "default", Cluster: cluster, RayJob: job}
	m, err := evidence.Capture(context.Background(), cs.CoreV1(), w, target, evidence.Options{Budget: 30 * time.Second, LogCap: evidence.DefaultLogCap}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	doc := w.files[evidence.ManifestFile]
	if err := schemas.ValidateEvidence(doc); err != nil {
		t.Fatalf("manifest.json breaks its schema: %v\n%s", err, doc)
	}
	for _, f := range m.Files {
		if b, ok := w.files[f.Path]; !ok || len(b) != f.Bytes {
			t.Errorf("manifest names %s (%d bytes); written: %v (%d bytes)", f.Path, f.Bytes, ok, len(b))
		}
	}
	if len(w.files) != len(m.Files)+1 {
		t.Errorf("%d files written, the manifest names %d besides itself", len(w.files), len(m.Files))
	}
	return &kept{manifest: m, files: w.files}
}

// log is a kept container log, ungzipped.
func (k *kept) log(t *testing.T, pod, container string, previous bool) string {
	t.Helper()
	name := "logs/" + pod + "/" + container + ".log.gz"
	if previous {
		name = "logs/" + pod + "/" + container + ".previous.log.gz"
	}
	b, ok := k.files[name]
	if !ok {
		t.Fatalf("no %s in the evidence (missing: %+v)", name, k.manifest.Missing)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(out)
}

// pod is a pod as pods.json keeps it.
func (k *kept) pod(t *testing.T, name string) evidence.PodRecord {
	t.Helper()
	var pods []evidence.PodRecord
	if err := json.Unmarshal(k.files["pods.json"], &pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("pod %s not in pods.json", name)
	return evidence.PodRecord{}
}

// hasEvent reports whether events.json has an event of reason about pod.
func (k *kept) hasEvent(pod, reason string) bool {
	var evs []corev1.Event
	if err := json.Unmarshal(k.files["events.json"], &evs); err != nil {
		return false
	}
	for _, e := range evs {
		if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod && e.Reason == reason {
			return true
		}
	}
	return false
}

// TestEvidenceOfAFailedJob: a failed job's evidence holds every Ray pod's
// and the submitter's logs, their statuses, the RayJob's events, and a
// complete manifest; a second capture writes nothing twice.
func TestEvidenceOfAFailedJob(t *testing.T) {
	t.Parallel()
	cs := clientset(t)
	_, rj := startJob(t, "sim-evidence", kubesim.Scenario{Outcome: kubesim.Fail, At: 3})
	rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusFailed, 60*time.Second)
	sub := submitterPod(t, rj.Name)
	waitFor(t, "the submitter pod ended", 20*time.Second, func() (bool, error) {
		sub = submitterPod(t, rj.Name)
		return sub.Status.Phase == corev1.PodFailed, nil
	})
	ev := captureEvidence(t, cs, "sim-evidence", rj.Name)
	if !ev.manifest.Complete || len(ev.manifest.Missing) != 0 {
		t.Errorf("manifest incomplete: %+v", ev.manifest.Missing)
	}
	pods := append(listPods(t, "sim-evidence", "head"), listPods(t, "sim-evidence", "worker")...)
	pods = append(pods, sub)
	for _, p := range pods {
		for _, c := range p.Spec.Containers {
			if got := ev.log(t, p.Name, c.Name, false); got == "" {
				t.Errorf("the evidence's log of %s/%s is empty", p.Name, c.Name)
			}
		}
		if ev.pod(t, p.Name).Node != p.Spec.NodeName {
			t.Errorf("pods.json: %s's node is not %s", p.Name, p.Spec.NodeName)
		}
	}
	// The workers' GPU nodes, as GKE labelled them, with their conditions.
	var nodes []evidence.NodeRecord
	if err := json.Unmarshal(ev.files["nodes.json"], &nodes); err != nil {
		t.Fatal(err)
	}
	for _, w := range listPods(t, "sim-evidence", "worker") {
		found := false
		for _, n := range nodes {
			if n.Name == w.Spec.NodeName {
				found = true
				if n.Labels[names.NodeAccelerator] == "" || n.Labels["cloud.google.com/gke-nodepool"] == "" || len(n.Conditions) == 0 {
					t.Errorf("nodes.json: node %s without its accelerator or node pool label, or conditions: %+v", n.Name, n)
				}
			}
		}
		if !found {
			t.Errorf("nodes.json has no node %s of worker %s", w.Spec.NodeName, w.Name)
		}
	}
	if got := ev.log(t, sub.Name, sub.Spec.Containers[0].Name, false); !strings.Contains(got, "Trial task failed") {
		t.Errorf("the submitter's log has no Ray Tune failure:\n%s", got)
	}
	var evs []corev1.Event
	if err := json.Unmarshal(ev.files["events.json"], &evs); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, e := range evs {
		kinds[e.InvolvedObject.Kind] = true
	}
	for _, k := range []string{"RayJob", "Pod"} {
		if !kinds[k] {
			t.Errorf("events.json has no event of a %s: %v", k, kinds)
		}
	}

	// A retried capture (a redelivery) writes nothing twice: every file is
	// the earlier one's.
	w := &memWriter{files: ev.files}
	before := len(w.files)
	m, err := evidence.Capture(context.Background(), cs.CoreV1(), w, evidence.Target{RunID: "sim-evidence-0001", Attempt: 1, Namespace: "default", Cluster: "sim-evidence", RayJob: rj.Name},
		evidence.Options{Budget: 30 * time.Second, LogCap: 64 << 10}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		if !f.Earlier {
			t.Errorf("the retried capture wrote %s again", f.Path)
		}
	}
	if len(w.files) != before {
		t.Errorf("the retried capture added %d files", len(w.files)-before)
	}
}
