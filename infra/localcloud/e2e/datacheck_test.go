package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raydrop/raydrop/infra/localcloud/hub"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// putData writes a dataset folder into the local data bucket: n PNG
// squares beside a metadata.jsonl whose rows edit may change (nil: drop
// the row), and extra objects.
func putData(t *testing.T, folder string, n int, edit func(i int, row map[string]any) map[string]any, extra map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	put := func(name string, data []byte) {
		w := st.GCS.Bucket(stack.DataBucket).Object(folder + "/" + name).NewWriter(ctx)
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	colours := map[string]color.RGBA{"red": {220, 40, 40, 255}, "blue": {40, 40, 220, 255}, "green": {40, 200, 40, 255}}
	keys := []string{"red", "blue", "green"}
	var meta bytes.Buffer
	for i := range n {
		img := image.NewRGBA(image.Rect(0, 0, 24, 24))
		for y := range 24 {
			for x := range 24 {
				img.Set(x, y, colours[keys[i%3]])
			}
		}
		var b bytes.Buffer
		if err := png.Encode(&b, img); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("images/%03d.png", i)
		put(name, b.Bytes())
		row := map[string]any{"file_name": name, "question": "What colour is the square?", "answer": "A " + keys[i%3] + " square."}
		if edit != nil {
			row = edit(i, row)
		}
		if row != nil {
			line, _ := json.Marshal(row)
			meta.Write(append(line, '\n'))
		}
	}
	put("metadata.jsonl", meta.Bytes())
	for name, data := range extra {
		put(name, data)
	}
}

// putObject writes one object into the local data bucket.
func putObject(t *testing.T, name string, data []byte) {
	t.Helper()
	w := st.GCS.Bucket(stack.DataBucket).Object(name).NewWriter(context.Background())
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// wrongParquet is a Parquet file, written by pyarrow, whose image column
// holds numbers.
func wrongParquet(t *testing.T) []byte {
	t.Helper()
	python, err := stack.TrainerPython()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "-c", `import io, sys, pyarrow as pa, pyarrow.parquet as pq
b = io.BytesIO()
pq.write_table(pa.table({"question": ["What colour is the square?"] * 3, "answer": ["Red."] * 3, "image": [1, 2, 3]}), b)
sys.stdout.buffer.write(b.getvalue())`).Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkedSpec is the example on its own cluster, reading folder of the data
// bucket with the data check on.
func checkedSpec(t *testing.T, cluster, folder string, template map[string]any, training map[string]any) []byte {
	t.Helper()
	tpl := map[string]any{"system": "You name colours.", "prompt": "{question}", "answer": "answer", "images": []string{"image"}}
	for k, v := range template {
		tpl[k] = v
	}
	extra := map[string]any{"dataset": map[string]any{"source": "gs://" + stack.DataBucket + "/" + folder, "check": true, "template": tpl}}
	if training != nil {
		extra["training"] = training
	}
	return specFor(t, cluster, extra)
}

// createdWorkerPods counts KubeRay's CreatedWorkerPod events of a cluster:
// every worker pod the RayCluster controller ever created.
func createdWorkerPods(t *testing.T, cluster string) int {
	t.Helper()
	l, err := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "RayCluster", "involvedObject.name": cluster, "reason": "CreatedWorkerPod"}.String()})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

func workerPods(t *testing.T, cluster string) []corev1.Pod {
	t.Helper()
	l, err := kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: names.LabelRayCluster + "=" + cluster + "," + names.LabelRayNodeType + "=worker"})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestDataCheckPassesThenTrains: a good dataset in the data bucket passes
// the real check (trainer/datacheck.py over the real objects), with no worker
// pod while it runs; then the workers come up and the run succeeds, its
// events carrying the check's figures. The check's driver staged the base
// model (one no other test trains) on the head, before any worker: the
// training attempt found it staged.
func TestDataCheckPassesThenTrains(t *testing.T) {
	t.Parallel()
	const model = "google/gemma-3-27b-it"
	putData(t, "e2e-good", 40, nil, nil)
	var sp map[string]any
	if err := json.Unmarshal(checkedSpec(t, "e2e-checked", "e2e-good", nil, nil), &sp); err != nil {
		t.Fatal(err)
	}
	sp["model"] = map[string]any{"id": model}
	data, _ := json.Marshal(sp)
	runID := upload(t, "checked", data, "steps=2,step=300ms,pending=3s")
	r := waitPhase(t, runID, 60*time.Second, runs.Checking, runs.Provisioned, runs.Submitted, runs.Running, runs.Succeeded, runs.Failed)
	if r.Phase == runs.Checking && (len(workerPods(t, "e2e-checked")) != 0 || createdWorkerPods(t, "e2e-checked") != 0) {
		t.Errorf("worker pods while the data check runs")
	}
	r = waitPhase(t, runID, 120*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("run ended %s %s: %s", r.Phase, r.Reason, r.Message)
	}
	if r.Check == nil || r.Check.Result == nil || !r.Check.Result.OK || r.Check.Result.Rows.Total != 40 || r.Check.Result.Images.Total != 40 {
		t.Fatalf("record's data check %+v", r.Check)
	}
	evs := eventsOf(t, runID)
	if count(evs, "checking") != 1 || count(evs, "running") != 1 || count(evs, "succeeded") != 1 {
		t.Errorf("events %+v", evs)
	}
	final := terminalOf(t, evs)
	if final.DataCheck == nil || !final.DataCheck.OK || final.DataCheck.Rows.Train+final.DataCheck.Rows.Eval != 40 {
		t.Errorf("succeeded event's data check %+v", final.DataCheck)
	}
	// The report shows what the check found.
	page := filepath.Join(reportDir, "checked.html")
	fetchReport(t, r, reportURI(t, evs), page)
	if b, err := os.ReadFile(page); err != nil || !strings.Contains(string(b), `id="data-check"`) || !strings.Contains(string(b), "<dt>Rows</dt><dd>40: ") {
		t.Errorf("the report does not show the data check (%v)", err)
	}
	if m := r.Model; m == nil || m.Repo != model || m.Commit != st.Hub.CommitOf(model) || !m.Staged || m.StagedBy != runID {
		t.Errorf("record's model %+v; want %s staged by the run's data check", m, model)
	}
	// The staging copied each file once; the check itself read the config
	// and the processor's files once more, and never the weights.
	got := st.Hub.Downloads(model)
	for f := range hub.Snapshot(model, 0) {
		want := 1
		if f != "model.safetensors" && f != "generation_config.json" {
			want = 2
		}
		if got[f] != want {
			t.Errorf("the Hub served %s %d times, want %d", f, got[f], want)
		}
	}
	staged := 0
	for _, j := range st.Sim.Played() {
		if j.Args["model-id"] == model && j.StagedModel {
			staged++
			if j.RayJob != "default/"+names.RayJob(runID, 0) {
				t.Errorf("Ray job of %s staged the model; want the data check's (attempt 0)", j.RayJob)
			}
		}
	}
	if staged != 1 {
		t.Errorf("%d Ray jobs staged %s, want the data check alone", staged, model)
	}
	// The workers came up only after the check: KubeRay created them then.
	// Its event recorder writes events from a goroutine of its own, so the
	// event is waited for.
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return createdWorkerPods(t, "e2e-checked") > 0, nil
	}); err != nil {
		t.Errorf("KubeRay recorded no worker pod for the run that trained: %v", err)
	}
	waitNoWorkers(t, "e2e-checked")
}

// TestHubDatasetPassesTheCheck: the example's own dataset, the tutorial's
// from the local Hub, passes the real check at the commit main points at,
// and the run trains from that commit.
func TestHubDatasetPassesTheCheck(t *testing.T) {
	t.Parallel()
	runID := upload(t, "hub-checked", specFor(t, "e2e-hub-checked", map[string]any{"dataset": map[string]any{"check": true}}), "steps=1,step=100ms")
	r := waitPhase(t, runID, 120*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("run ended %s %s: %s", r.Phase, r.Reason, r.Message)
	}
	c := r.Check
	if c == nil || c.Result == nil || !c.Result.OK || c.Result.Rows.Total != 48 || c.Result.Images.Total != 48 || c.Result.Dataset == nil {
		t.Fatalf("record's data check %+v", c)
	}
	if d := c.Result.Dataset; d.Source != hub.TutorialDatasetID || d.ResolvedRevision != st.Hub.DatasetCommit(hub.TutorialDatasetID) {
		t.Errorf("the check read %+v; want %s at %s", d, hub.TutorialDatasetID, st.Hub.DatasetCommit(hub.TutorialDatasetID))
	}
	trained := 0
	for _, j := range st.Sim.Played() {
		if j.RayJob == "default/"+names.RayJob(runID, 1) {
			trained++
			if j.Args["dataset-revision"] != st.Hub.DatasetCommit(hub.TutorialDatasetID) {
				t.Errorf("the training attempt reads revision %q; want the commit the check read", j.Args["dataset-revision"])
			}
		}
	}
	if trained != 1 {
		t.Errorf("%d training attempts played, want 1", trained)
	}
}

// TestBadDataFailsBeforeAnyWorker: each class of bad data ends the run
// FAILED InvalidData, with the file, row and column in the message, and
// KubeRay never created a worker pod for it.
func TestBadDataFailsBeforeAnyWorker(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("Look closely at the picture before you answer. ", 30)
	for _, c := range []struct {
		name     string
		data     func(folder string)
		template map[string]any
		message  []string
	}{
		{"missing column", func(f string) { putData(t, f, 6, nil, nil) }, map[string]any{"answer": "label"},
			[]string{"/metadata.jsonl lacks column(s) ['label'] that dataset.template names"}},
		{"image that does not decode", func(f string) {
			putData(t, f, 6, nil, map[string][]byte{"images/004.png": []byte("\x89PNG\r\n\x1a\n but not really")})
		}, nil, []string{"/metadata.jsonl line 5 column 'image': image gs://" + stack.DataBucket + "/", "images/004.png does not decode"}},
		{"too many rows over maxSeqLength", func(f string) {
			putData(t, f, 10, func(i int, row map[string]any) map[string]any {
				if i%2 == 0 {
					row["question"] = long + fmt.Sprint(row["question"])
				}
				return row
			}, nil)
		}, nil, []string{"5 of 10 rows (50.0 %) are left out (5 longer than training.maxSeqLength)", "training.maxDroppedShare 0.05"}},
		{"placeholder with no column", func(f string) { putData(t, f, 6, nil, nil) }, map[string]any{"prompt": "{question} Its {shape}?"},
			[]string{"lacks column(s) ['shape']", "dataset.template.prompt has placeholder(s) ['{shape}']"}},
		{"empty split", func(f string) {
			putData(t, f, 3, func(int, map[string]any) map[string]any { return nil }, nil)
		}, nil, []string{"/metadata.jsonl has no rows"}},
		{"parquet with a wrong schema", func(f string) { putObject(t, f+"/train.parquet", wrongParquet(t)) }, nil,
			[]string{"/train.parquet row 0 column 'image'"}},
		{"hub revision that does not exist", nil, map[string]any{"revision": "v9"},
			[]string{"dataset '" + hub.TutorialDatasetID + "' has no revision 'v9' on the Hub"}},
		{"gated dataset without a token", nil, map[string]any{"id": stack.GatedDataset},
			[]string{"dataset '" + stack.GatedDataset + "' is gated on the Hub and the deployment's Hub token is not set (HF_TOKEN)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			slug := strings.ToLower(strings.ReplaceAll(c.name, " ", "-"))
			cluster := "e2e-bad-" + slug[:min(len(slug), 20)]
			cluster = strings.TrimSuffix(cluster, "-")
			sp := checkedSpec(t, cluster, "bad-"+slug, c.template, nil)
			if c.data != nil {
				c.data("bad-" + slug)
			} else { // a Hub dataset: c.template holds the spec's dataset fields
				sp = specFor(t, cluster, map[string]any{"dataset": maps.Collect(func(yield func(string, any) bool) {
					yield("check", true)
					for k, v := range c.template {
						yield(k, v)
					}
				})})
			}
			runID := upload(t, "bad-"+slug, sp, "pending=1s")
			r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
			if r.Phase != runs.Failed || r.Reason != runs.InvalidData || len(r.Attempts) != 0 {
				t.Fatalf("phase %s reason %s attempts %d: %s", r.Phase, r.Reason, len(r.Attempts), r.Message)
			}
			for _, part := range c.message {
				if !strings.Contains(r.Message, part) {
					t.Errorf("message %q lacks %q", r.Message, part)
				}
			}
			evs := eventsOf(t, runID)
			if count(evs, "checking") != 1 || count(evs, "failed") != 1 || count(evs, "running") != 0 {
				t.Errorf("events %+v", evs)
			}
			final := terminalOf(t, evs)
			if final.DataCheck == nil || final.DataCheck.OK || final.Reason != runs.InvalidData {
				t.Errorf("failed event %+v", final)
			}
			page := filepath.Join(reportDir, "bad-"+slug+".html")
			fetchReport(t, r, reportURI(t, evs), page)
			if b, err := os.ReadFile(page); err != nil || !strings.Contains(string(b), "The data check refused the run (InvalidData)") {
				t.Errorf("the report does not say the data check refused the run (%v)", err)
			}
			if n := rayJobsOf(t, runID); n != 1 {
				t.Errorf("%d RayJobs, want the check's alone", n)
			}
			if n, pods := createdWorkerPods(t, cluster), workerPods(t, cluster); n != 0 || len(pods) != 0 {
				t.Errorf("KubeRay created %d worker pods (%d exist) for a run whose data failed the check", n, len(pods))
			}
		})
	}
}
