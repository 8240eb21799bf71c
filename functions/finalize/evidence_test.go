package finalize

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/schemas"
)

// TestFinalizeKeepsEvidence: before the workers go, finalize keeps the
// attempt's pods' evidence beside the checkpoints, records the folder, and
// names it in the terminal event; a redelivery captures nothing again.
// (The capture itself is tested against a real API server in the local
// cloud's kubesim and end-to-end suites.)
func TestFinalizeKeepsEvidence(t *testing.T) {
	const id = "run-1"
	w := pipelinetest.New(t)
	r := w.NewRun(id, w.Spec(nil), runs.Finishing, runs.Ending{Outcome: runs.OutcomeFailed, Reason: runs.ApplicationError, Message: "training failed"})
	w.Bring(r)
	w.WriteLayout(r, 1, 1, "failed")
	r = w.Record(id)
	head := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: r.Cluster + "-head-x7k2p", Namespace: r.Namespace, Labels: map[string]string{names.LabelRayCluster: r.Cluster}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "ray-head"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "ray-head", RestartCount: 1, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}},
		}}},
	}
	if _, err := w.Kube.CoreV1().Pods(r.Namespace).Create(w.Ctx, head, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"cloud.google.com/gke-nodepool": "pool-1"}}}
	if _, err := w.Kube.CoreV1().Nodes().Create(w.Ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	finished := w.StepEvent(w.Deps.Config.Topics.Finished, pipeline.Step{RunID: id, Attempt: 1})
	if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, finished); err != nil {
		t.Fatal(err)
	}
	r = w.Record(id)
	if !strings.HasPrefix(r.Evidence, "gs://"+pipelinetest.Output+"/") || !strings.HasSuffix(r.Evidence, "/"+id+"/evidence/") {
		t.Fatalf("record's evidence %q, want gs://%s/.../%s/evidence/", r.Evidence, pipelinetest.Output, id)
	}
	folder := strings.TrimPrefix(r.Evidence, "gs://"+pipelinetest.Output+"/") + "attempt-1/"
	read := func(name string) []byte {
		t.Helper()
		rd, err := w.GCS.Bucket(pipelinetest.Output).Object(folder + name).NewReader(w.Ctx)
		if err != nil {
			t.Fatalf("%s: %v", folder+name, err)
		}
		defer func() { _ = rd.Close() }()
		b, _ := io.ReadAll(rd)
		return b
	}
	doc := read(evidence.ManifestFile)
	if err := schemas.ValidateEvidence(doc); err != nil {
		t.Fatalf("manifest: %v\n%s", err, doc)
	}
	var m evidence.Manifest
	_ = json.Unmarshal(doc, &m)
	var paths []string
	for _, f := range m.Files {
		paths = append(paths, f.Path)
	}
	want := []string{"events.json", "logs/" + head.Name + "/ray-head.log.gz", "logs/" + head.Name + "/ray-head.previous.log.gz", "nodes.json", "pods.json"}
	if strings.Join(paths, " ") != strings.Join(want, " ") || !m.Complete || m.RayJob != names.RayJob(id, 1) {
		t.Errorf("manifest files %v complete %v job %s; want %v, complete, %s", paths, m.Complete, m.RayJob, want, names.RayJob(id, 1))
	}
	if !strings.Contains(string(read("pods.json")), `"reason": "OOMKilled"`) {
		t.Errorf("pods.json lacks the head's OOMKilled restart:\n%s", read("pods.json"))
	}
	var terminal events.Run
	for _, msg := range w.Sent(w.Deps.Config.Topics.Events) {
		var d events.Run
		_ = json.Unmarshal(msg.Data, &d)
		if d.Phase == "failed" {
			terminal = d
		}
	}
	if terminal.Evidence != r.Evidence {
		t.Errorf("the failed event's evidence %q, want %q", terminal.Evidence, r.Evidence)
	}
	// The cause, named from the evidence read back: the head's container
	// the OOM killer ended.
	if c := r.Cause; c == nil || c.Kind != "OOMKilled" || c.Pod != head.Name || c.Hint == "" {
		t.Errorf("record's cause %+v, want OOMKilled on %s with a hint", c, head.Name)
	}
	if terminal.Cause != "OOMKilled" || !strings.Contains(terminal.Summary, "OOMKilled") || terminal.Hint == "" {
		t.Errorf("the failed event's cause %q summary %q hint %q, want OOMKilled", terminal.Cause, terminal.Summary, terminal.Hint)
	}
	if w.Workers() != 0 {
		t.Errorf("%d workers after finalize", w.Workers())
	}

	// A redelivery of the finished message before the record was written
	// finds the manifest and keeps what is there.
	r.Evidence = ""
	before := len(w.Kube.Actions())
	if got := w.Deps.KeepEvidence(w.Ctx, r, r.Attempt); got == "" {
		t.Error("a second capture found no evidence")
	}
	if after := w.Kube.Actions(); len(after) != before {
		t.Errorf("the second capture read the pods again: %v", after[before:])
	}
}
