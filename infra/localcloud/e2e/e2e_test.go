package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	"github.com/santhosh-tekuri/jsonschema/v6"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/cli"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

const output = "raydrop-e2e-checkpoints"

var (
	st      *stack.Stack
	evs     *probe.Events // the public events topic, as a subscriber sees it
	ray     rayclient.Interface
	kube    kubernetes.Interface
	example []byte
)

// TestMain starts one local cloud for the whole suite: the real emulators,
// kube-apiserver with KubeRay's reconcilers and the functions as processes.
func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	st, err = stack.Start(ctx, stack.Options{Repo: "../../..", Tick: 2 * time.Second, OutputBuckets: []string{output}, DefaultSim: "step=400ms", Progress: os.Stderr, Race: true, Subscriber: true})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start local cloud: %v\n", err)
		os.Exit(1)
	}
	code := func() int {
		defer st.Stop()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if evs, err = probe.TapEvents(rctx, st, "e2e-events"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if ray, err = rayclient.NewForConfig(st.Sim.Config); err != nil {
			return 1
		}
		if kube, err = kubernetes.NewForConfig(st.Sim.Config); err != nil {
			return 1
		}
		if example, err = os.ReadFile("../../../examples/gemma3-vision.json"); err != nil {
			return 1
		}
		// The CLI finds the local cloud the way a person's shell would.
		for _, kv := range st.Env() {
			k, v, _ := strings.Cut(kv, "=")
			_ = os.Setenv(k, v)
		}
		code := m.Run()
		// The functions run under the race detector, each serving many
		// events at once: a race, or any other death, ends its process.
		if exits := st.Exits(); len(exits) > 0 {
			fmt.Fprintf(os.Stderr, "function processes died on their own: %v\n", exits)
			code = 1
		}
		if code != 0 {
			st.KeepState()
			fmt.Fprintf(os.Stderr, "local cloud logs kept in %s\n", st.StateDir())
		}
		return code
	}()
	os.Exit(code)
}

// specFor is the example spec on its own cluster (so scenarios run side by
// side) with the given overrides merged in.
func specFor(t *testing.T, cluster string, extra map[string]any) []byte {
	t.Helper()
	b, err := probe.Spec(example, cluster, output, extra)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// upload drops a spec into jobs/ with a scenario for its simulated Ray job.
func upload(t *testing.T, name string, data []byte, scenario string) string {
	t.Helper()
	runID, err := probe.Upload(context.Background(), st, name, data, scenario)
	if err != nil {
		t.Fatal(err)
	}
	return runID
}

// waitPhase polls the run record until it reaches one of want.
func waitPhase(t *testing.T, runID string, limit time.Duration, want ...runs.Phase) *runs.Record {
	t.Helper()
	r, err := probe.WaitPhase(context.Background(), st, runID, limit, want...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// eventsOf waits until the run's terminal event arrived, then until the
// run is announced (its report's event too) and a little more (a duplicate
// would arrive by then), validates every event against its schema, checks
// that the message bus got the same ones, and returns them.
func eventsOf(t *testing.T, runID string) []probe.Seen {
	t.Helper()
	// Longer than the events subscription's ack deadline, should the emulator
	// hold a delivery until it passes.
	if _, err := evs.WaitTerminal(runID, 40*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := probe.WaitAnnounced(context.Background(), st, runID, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	seen, err := evs.WaitPublished(context.Background(), st, runID, 40*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range seen {
		validate(t, e.Run)
	}
	// The message bus got the same events, once each (longer: while
	// TestBusOutage holds the bus down, they wait for the sweep).
	onBus(t, runID, seen, 90*time.Second)
	return seen
}

func count(evs []probe.Seen, phase string) int { return probe.Count(evs, phase) }

// terminalOf is the run's terminal event.
func terminalOf(t *testing.T, evs []probe.Seen) probe.Seen {
	t.Helper()
	e := probe.Terminal(evs)
	if e == nil {
		t.Fatalf("no terminal event among %+v", evs)
	}
	return *e
}

// reportURI is the report the run's report_ready event names: the
// terminal event, out before the report is written, names none.
func reportURI(t *testing.T, evs []probe.Seen) string {
	t.Helper()
	e := probe.Report(evs)
	if e == nil {
		t.Fatalf("no %s event among %+v", events.ReportReady, evs)
	}
	if term := probe.Terminal(evs); term != nil && term.Report != "" {
		t.Errorf("the %s event names report %s: it went out before the report was written", term.Phase, term.Report)
	}
	return e.Report
}

func terminalEvents(evs []probe.Seen) int { return probe.Count(evs, "terminal") }

// waitNoWorkers waits until the cluster has no worker pod.
func waitNoWorkers(t *testing.T, cluster string) {
	t.Helper()
	if err := probe.WaitNoWorkers(context.Background(), kube, cluster, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

func rayJobsOf(t *testing.T, runID string) int {
	t.Helper()
	l, err := ray.RayV1().RayJobs("default").List(context.Background(), metav1.ListOptions{LabelSelector: names.LabelRunID + "=" + runID})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

func TestSucceeds(t *testing.T) {
	t.Parallel()
	runID := upload(t, "success", specFor(t, "e2e-success", nil), "steps=3,step=300ms,dropped=1")
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("run ended %s: %s", r.Phase, r.Message)
	}
	evs := eventsOf(t, runID)
	if count(evs, "accepted") != 1 || count(evs, "running") != 1 || count(evs, "succeeded") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	final := terminalOf(t, evs)
	if len(final.Checkpoints) != 3 || final.LatestCheckpoint == nil || final.BestCheckpoint == nil || final.GPUHours == nil {
		t.Fatalf("succeeded event %+v", final)
	}
	// 3 steps an epoch of 16 workers x 4 samples, the 10 rows held out
	// (5 % of what fits) and the one row too long.
	if d := final.Data; d == nil || *d != (checkpoints.DataStats{Rows: 3*64 + 10 + 1, DroppedRows: 1, MaxSeqLength: 1024, EvalRows: 10}) {
		t.Errorf("succeeded event's data %+v", d)
	}
	if s := final.Samples; s == nil || s.Count != 8 || !strings.HasSuffix(s.URI, "/samples/samples.json") {
		t.Errorf("succeeded event's samples %+v, want 8 in samples/samples.json", s)
	} else if _, ok := final.Timings["sampleAnswers"]; !ok {
		t.Errorf("timings %v lack sampleAnswers", final.Timings)
	} else if _, err := st.GCS.Bucket(output).Object(strings.TrimPrefix(s.URI, "gs://"+output+"/")).Attrs(context.Background()); err != nil {
		t.Errorf("samples %s: %v", s.URI, err)
	}
	if _, ok := final.BestCheckpoint.Metrics["eval_loss"]; !ok || final.BestBy != "eval_loss" {
		t.Errorf("best checkpoint %+v chosen by %q, want by eval_loss", final.BestCheckpoint, final.BestBy)
	}
	for _, c := range final.Checkpoints {
		name := strings.TrimPrefix(c.URI, "gs://"+output+"/") + "/adapter_model.safetensors"
		if _, err := st.GCS.Bucket(output).Object(name).Attrs(context.Background()); err != nil {
			t.Errorf("checkpoint %s: %v", c.URI, err)
		}
	}
	if n := rayJobsOf(t, runID); n != 1 {
		t.Errorf("%d RayJobs, want 1", n)
	}
	// The deployment's trainer image, by digest, in the events; its RayJob
	// installs nothing.
	if want := (events.Images{Head: stack.TrainerImage, Workers: stack.TrainerImage, Trainer: true}); final.Images == nil || *final.Images != want {
		t.Errorf("succeeded event's images %+v, want %+v", final.Images, want)
	}
	jobs, err := ray.RayV1().RayJobs("default").List(context.Background(), metav1.ListOptions{LabelSelector: names.LabelRunID + "=" + runID})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		var env map[string]any
		if err := yaml.Unmarshal([]byte(j.Spec.RuntimeEnvYAML), &env); err != nil {
			t.Fatal(err)
		}
		if _, ok := env["pip"]; ok {
			t.Errorf("RayJob %s on the trainer image installs packages:\n%s", j.Name, j.Spec.RuntimeEnvYAML)
		}
	}
	waitNoWorkers(t, "e2e-success")
}

func TestApplicationFailure(t *testing.T) {
	t.Parallel()
	runID := upload(t, "appfail", specFor(t, "e2e-appfail", nil), "outcome=fail,at=3,step=200ms")
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Failed || r.Attempt != 1 || r.Reason != runs.ApplicationError || !strings.Contains(r.Message, "training failed") {
		t.Fatalf("phase %s attempt %d reason %s %q; want FAILED on attempt 1 with the training error", r.Phase, r.Attempt, r.Reason, r.Message)
	}
	evs := eventsOf(t, runID)
	if count(evs, "failed") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	// A failed run gets its report too.
	fetchReport(t, r, reportURI(t, evs), filepath.Join(reportDir, "failed.html"))
	// Its evidence holds the driver's failure.
	checkEvidence(t, r, evs, "Trial task failed")
	checkCause(t, runID, evs, "PythonException", "the training code raised RuntimeError")
	waitNoWorkers(t, "e2e-appfail")
	// With the workers gone, the bucket alone says why.
	checkDiagnose(t, runID, "PythonException", "RuntimeError: simulated training failure at step 3")
}

// TestTooManyLongRows: a dataset with more rows over maxSeqLength than
// maxDroppedShare allows fails before training, once, saying why.
func TestTooManyLongRows(t *testing.T) {
	t.Parallel()
	runID := upload(t, "longrows", specFor(t, "e2e-longrows", nil), "steps=2,dropped=20")
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Failed || r.Attempt != 1 || r.Reason != runs.ApplicationError ||
		!strings.Contains(r.Message, "20 of 155 rows (12.9 %) are longer than --max-seq-length 1024") ||
		!strings.Contains(r.Message, "training.maxDroppedShare") {
		t.Fatalf("phase %s attempt %d reason %s %q; want FAILED on attempt 1 naming the long rows", r.Phase, r.Attempt, r.Reason, r.Message)
	}
	if evs := eventsOf(t, runID); count(evs, "failed") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	waitNoWorkers(t, "e2e-longrows")
}

func TestHeadLossRetriesAndResumes(t *testing.T) {
	t.Parallel()
	runID := upload(t, "headloss", specFor(t, "e2e-headloss", nil), "outcome=lose-head,at=6,steps=3,step=200ms")
	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Attempt != 2 {
		t.Fatalf("phase %s attempt %d (%s); want SUCCEEDED on attempt 2", r.Phase, r.Attempt, r.Message)
	}
	if a := r.CurrentAttempt(); a == nil || !strings.Contains(a.ResumeFrom, "attempt-1/") {
		t.Errorf("attempt 2 does not resume from attempt 1's checkpoint: %+v", a)
	}
	if evs := eventsOf(t, runID); count(evs, "succeeded") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	waitNoWorkers(t, "e2e-headloss")
}

func TestHangHitsDeadline(t *testing.T) {
	t.Parallel()
	runID := upload(t, "hang", specFor(t, "e2e-hang", map[string]any{"limits": map[string]any{"deadline": "1m", "startDeadline": "1m"}}), "outcome=hang,at=2,step=200ms")
	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Failed || r.Reason != runs.DeadlineExceeded {
		t.Fatalf("phase %s reason %s %q; want FAILED by the deadline", r.Phase, r.Reason, r.Message)
	}
	if n := rayJobsOf(t, runID); n != 0 {
		t.Errorf("%d RayJobs left after the deadline, want 0 (deleted)", n)
	}
	// The monitor kept the evidence before it deleted the RayJob (and
	// with it the submitter): the hung job's output up to its last step.
	checkEvidence(t, r, eventsOf(t, runID), "Tailing logs until the job exits")
	checkCause(t, runID, eventsOf(t, runID), "DeadlineExceeded", "longer than limits.deadline")
	waitNoWorkers(t, "e2e-hang")
}

func TestCancel(t *testing.T) {
	t.Parallel()
	runID := upload(t, "cancel", specFor(t, "e2e-cancel", nil), "outcome=hang,at=2,step=200ms")
	waitPhase(t, runID, 60*time.Second, runs.Running)
	cancelRun(t, runID)
	r := waitPhase(t, runID, 60*time.Second, runs.Cancelled, runs.Failed, runs.Succeeded)
	if r.Phase != runs.Cancelled {
		t.Fatalf("phase %s (%s), want CANCELLED", r.Phase, r.Message)
	}
	evs := eventsOf(t, runID)
	if count(evs, "cancelled") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	for _, e := range evs {
		if e.Phase == "cancelled" && (e.Reason != runs.ReasonCancelled || e.Message == "") {
			t.Errorf("cancelled event: reason %q message %q, want Cancelled and a message", e.Reason, e.Message)
		}
	}
	if n := rayJobsOf(t, runID); n != 0 {
		t.Errorf("%d RayJobs left after cancellation, want 0", n)
	}
	checkEvidence(t, r, evs, "Tailing logs until the job exits")
	checkCause(t, runID, evs, "Cancelled", "cancelled by a user")
	waitNoWorkers(t, "e2e-cancel")
}

// cancelRun drops cancel/<runID> into the intake bucket, as `raydrop
// cancel` does.
func cancelRun(t *testing.T, runID string) {
	t.Helper()
	w := st.GCS.Bucket(stack.IntakeBucket).Object("cancel/" + runID).NewWriter(context.Background())
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCancelWhileQueued queues a run behind a running one and cancels it,
// then cancels the first: a third run on the same cluster runs at once, and
// the workers go to zero after it. A cancelled queued run used to stay
// FINISHING and hold the cluster for good.
func TestCancelWhileQueued(t *testing.T) {
	t.Parallel()
	data := specFor(t, "e2e-cancel-queued", nil)
	first := upload(t, "cancel-queued-first", data, "outcome=hang,at=2,step=200ms")
	waitPhase(t, first, 60*time.Second, runs.Running)
	queued := upload(t, "cancel-queued-second", data, "steps=2,step=200ms")
	waitPhase(t, queued, 60*time.Second, runs.Queued)
	cancelRun(t, queued)
	if r := waitPhase(t, queued, 60*time.Second, runs.Cancelled, runs.Failed, runs.Succeeded); r.Phase != runs.Cancelled {
		t.Fatalf("queued run %s (%s), want CANCELLED", r.Phase, r.Message)
	}
	if evs := eventsOf(t, queued); count(evs, "queued") != 1 || count(evs, "cancelled") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("queued run's events %+v", evs)
	}
	cancelRun(t, first)
	if r := waitPhase(t, first, 60*time.Second, runs.Cancelled, runs.Failed, runs.Succeeded); r.Phase != runs.Cancelled {
		t.Fatalf("first run %s (%s), want CANCELLED", r.Phase, r.Message)
	}
	third := upload(t, "cancel-queued-third", data, "steps=2,step=200ms")
	r := waitPhase(t, third, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("third run %s (%s), want SUCCEEDED", r.Phase, r.Message)
	}
	if _, queued := r.Times[runs.Queued]; queued {
		t.Errorf("third run was queued (%v) on a cluster nobody held", r.Times)
	}
	waitNoWorkers(t, "e2e-cancel-queued")
}

// TestDuplicateRequests publishes the same request five times: one run,
// one RayJob, one terminal event.
func TestDuplicateRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	data := specFor(t, "e2e-dup", map[string]any{"runId": "e2e-duplicate-request"})
	pub := st.PS.Publisher(stack.Topics.Requests)
	defer pub.Stop()
	for range 5 {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: data}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := waitPhase(t, "e2e-duplicate-request", 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("phase %s (%s)", r.Phase, r.Message)
	}
	if evs := eventsOf(t, r.RunID); count(evs, "accepted") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	if n := rayJobsOf(t, r.RunID); n != 1 {
		t.Errorf("%d RayJobs, want 1", n)
	}
}

func TestMalformedSpecIsRejected(t *testing.T) {
	t.Parallel()
	runID := upload(t, "malformed", []byte(`{"apiVersion": "raydrop.dev/v1", "lora": {"rank": 8}, "training": {"epochs": 0}}`), "")
	r := waitPhase(t, runID, 30*time.Second, runs.Rejected)
	paths := map[string]bool{}
	for _, p := range r.Problems {
		paths[p.Path] = true
	}
	for _, want := range []string{"lora.rank", "training.epochs", "cluster.serviceAccount", "output.bucket"} {
		if !paths[want] {
			t.Errorf("REJECTED record does not name %s: %v", want, r.Problems)
		}
	}
	if evs := eventsOf(t, runID); count(evs, "rejected") != 1 {
		t.Errorf("events %+v", evs)
	}
}

// validate checks a published event's data against the JSON Schema of its
// type in the repository, with an independent validator.
func validate(t *testing.T, e events.Run) {
	t.Helper()
	file := "../../../schemas/events/" + events.Type(e.Phase) + ".json"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(file, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(file)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(e)
	inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err := sch.Validate(inst); err != nil {
		t.Errorf("%s event of run %s does not match %s: %v", e.Phase, e.RunID, file, err)
	}
}

// validateEnvelope validates a structured-mode CloudEvent against
// schemas/events/cloudevent.json, which refers to the data's schemas there.
func validateEnvelope(t *testing.T, event []byte) {
	t.Helper()
	files, _ := filepath.Glob("../../../schemas/events/*.json")
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(doc.(map[string]any)["$id"].(string), doc); err != nil {
			t.Fatal(err)
		}
	}
	sch, err := c.Compile(events.EnvelopeID)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(event))
	if err != nil {
		t.Fatalf("not JSON: %v\n%s", err, event)
	}
	if err := sch.Validate(inst); err != nil {
		t.Errorf("event does not match %s: %v\n%s", events.EnvelopeID, err, event)
	}
}

// TestDuplicateStorageEvents delivers the intake notification of one
// upload five times: one run, one RayJob, one terminal event.
func TestDuplicateStorageEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := "jobs/dup-object.json"
	data := specFor(t, "e2e-dupobj", nil)
	runID, gen, err := probe.UploadObject(ctx, st, "dup-object", data, "steps=2,step=200ms")
	if err != nil {
		t.Fatal(err)
	}
	pub := st.PS.Publisher(stack.NotifyTopic)
	defer pub.Stop()
	for range 4 { // the fifth is fake-gcs-server's own
		if _, err := pub.Publish(ctx, probe.Notification(name, gen, len(data))).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("phase %s (%s)", r.Phase, r.Message)
	}
	if evs := eventsOf(t, runID); count(evs, "accepted") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	if n := rayJobsOf(t, runID); n != 1 {
		t.Errorf("%d RayJobs, want 1", n)
	}
}

// TestQueueOnOneCluster drops two specs for one cluster together: the
// second waits QUEUED, runs after the first, and the workers go to zero only
// after both.
func TestQueueOnOneCluster(t *testing.T) {
	t.Parallel()
	data := specFor(t, "e2e-queue", nil)
	a := upload(t, "queue-a", data, "steps=3,step=300ms")
	b := upload(t, "queue-b", data, "steps=3,step=300ms")
	ra := waitPhase(t, a, 120*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	rb := waitPhase(t, b, 120*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if ra.Phase != runs.Succeeded || rb.Phase != runs.Succeeded {
		t.Fatalf("phases %s (%s), %s (%s)", ra.Phase, ra.Message, rb.Phase, rb.Message)
	}
	first, second := ra, rb
	if _, queued := ra.Times[runs.Queued]; queued {
		first, second = rb, ra
	}
	if _, queued := second.Times[runs.Queued]; !queued {
		t.Fatalf("neither run was QUEUED: %v / %v", ra.Times, rb.Times)
	}
	if !second.Times[runs.Provisioned].After(first.Times[runs.Succeeded].Add(-time.Second)) {
		t.Errorf("the queued run was provisioned at %s, before the first ended at %s", second.Times[runs.Provisioned], first.Times[runs.Succeeded])
	}
	if evs := eventsOf(t, second.RunID); count(evs, "queued") != 1 {
		t.Errorf("events %+v", evs)
	}
	waitNoWorkers(t, "e2e-queue")
}

// TestBurstServedAtOnce uploads 12 specs at once over 6 clusters: the
// local Eventarc delivers the intake events to Provision many at once, as
// Cloud Run's concurrency does, and the functions (built with the race
// detector, which would end a process at its first data race: TestMain
// checks that none died) admit one run per cluster once, queue the other,
// and run them all to success.
func TestBurstServedAtOnce(t *testing.T) {
	watch := probe.WatchDeliveries(st, "provision-intake")
	defer watch.Stop()
	const n, clusters = 12, 6
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = upload(t, fmt.Sprintf("burst-%02d", i), specFor(t, fmt.Sprintf("e2e-burst-%d", i%clusters), nil), "steps=1,step=100ms")
		})
	}
	wg.Wait()
	for _, id := range ids {
		if r := waitPhase(t, id, 240*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled); r.Phase != runs.Succeeded {
			t.Errorf("run %s ended %s: %s", id, r.Phase, r.Message)
		}
	}
	for _, id := range ids {
		if evs := eventsOf(t, id); count(evs, "accepted") != 1 || terminalEvents(evs) != 1 {
			t.Errorf("run %s: events %+v, want one accepted and one terminal", id, evs)
		}
	}
	delivered, most, _ := watch.Stop()
	if most < 4 {
		t.Errorf("at most %d intake events were delivered to Provision at once, want several (the emulator's push alone allows 2)", most)
	}
	t.Logf("%d intake deliveries, at most %d at once", delivered, most)
}

// TestLostFinishedMessage loses the next finished message (Eventarc
// acknowledges it and never delivers): the tick's sweep resends it, and the
// run still ends once, with its workers gone. It runs alone, before the
// parallel tests, so the lost message is its own.
func TestLostFinishedMessage(t *testing.T) {
	st.Adapter.DropNext("finalize", 1)
	runID := upload(t, "lost-finished", specFor(t, "e2e-lost", nil), "steps=2,step=200ms")
	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("phase %s (%s)", r.Phase, r.Message)
	}
	if got := st.Adapter.Stats()["finalize"].Dropped; got != 1 {
		t.Errorf("finalize pushes dropped: %d, want 1", got)
	}
	if evs := eventsOf(t, runID); count(evs, "succeeded") != 1 || terminalEvents(evs) != 1 {
		t.Errorf("events %+v", evs)
	}
	waitNoWorkers(t, "e2e-lost")
}

func raydrop(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCLI drives the local cloud through the raydrop command: submit,
// watch to success, list, status, events, and cancel.
func TestCLI(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/cli-job.json"
	if err := os.WriteFile(file, specFor(t, "e2e-cli", nil), 0o644); err != nil {
		t.Fatal(err)
	}
	evDone, jsonDone := make(chan string, 1), make(chan string, 1)
	go func() {
		code, out, errOut := raydrop("events", "--count", "2")
		evDone <- fmt.Sprintf("%d\n%s\n%s", code, out, errOut)
	}()
	time.Sleep(2 * time.Second) // the events command subscribes first

	code, out, errOut := raydrop("submit", file)
	if code != 0 {
		t.Fatalf("submit: exit %d: %s", code, errOut)
	}
	runID := strings.TrimSpace(out)
	go func() { // other tests' runs end meanwhile: this one's only
		code, out, errOut := raydrop("events", "--json", "--run", runID, "--type", "succeeded", "--count", "1")
		jsonDone <- fmt.Sprintf("%d\n%s\n%s", code, out, errOut)
	}()
	code, out, errOut = raydrop("watch", runID, "--interval", "300ms")
	if code != 0 || !strings.Contains(out, "SUCCEEDED") || strings.Count(out, "checkpoint gs://") != 3 {
		t.Fatalf("watch: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "RUNNING") {
		t.Errorf("watch never showed RUNNING:\n%s", out)
	}
	// The report, written after the terminal event, once its event is out.
	if !strings.Contains(out, "report     gs://") {
		t.Errorf("watch did not show the report:\n%s", out)
	}
	code, out, _ = raydrop("list", "--json")
	var listed []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || !strings.Contains(out, runID) {
		t.Errorf("list: exit %d, run %s missing:\n%s", code, runID, out)
	}
	code, out, _ = raydrop("status", runID, "--json")
	var rec runs.Record
	var status map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || json.Unmarshal([]byte(out), &status) != nil || rec.Phase != runs.Succeeded {
		t.Errorf("status: exit %d:\n%s", code, out)
	}
	// Where the pods' evidence was kept before the teardown.
	if code, out, _ := raydrop("status", runID); code != 0 || rec.Evidence == "" || !strings.Contains(out, "evidence") || !strings.Contains(out, rec.Evidence) {
		t.Errorf("status: exit %d, no evidence folder %q:\n%s", code, rec.Evidence, out)
	}
	// The driver's log, kept beside the run: the trainer's lines to its end.
	if code, out, errOut := raydrop("logs", runID); code != 0 || !strings.Contains(out, "raydrop: run "+runID) ||
		!strings.Contains(out, "'loss': ") || !strings.Contains(out, "raydrop: succeeded; wrote gs://") {
		t.Errorf("logs: exit %d %s\n%s", code, errOut, out)
	}
	if code, _, errOut := raydrop("logs", runID, "--attempt", "2"); code != 1 || !strings.Contains(errOut, "has attempts 1 to 1, not 2") {
		t.Errorf("logs --attempt 2 of a one-attempt run: exit %d %s", code, errOut)
	}
	// A live pod's log, through the API server and the kubelet: the head's
	// ray start.
	heads, err := kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "ray.io/node-type=head,ray.io/cluster=e2e-cli"})
	if err != nil || len(heads.Items) != 1 {
		t.Fatalf("head pods of e2e-cli: %v, %v", heads, err)
	}
	head := heads.Items[0].Name
	if code, out, errOut := raydrop("logs", runID, "--pod", head, "--tail", "3"); code != 0 || !strings.Contains(out, "This command will now block forever") || strings.Count(out, "\n") != 3 {
		t.Errorf("logs --pod %s --tail 3: exit %d %s\n%s", head, code, errOut, out)
	}
	if code, _, errOut := raydrop("logs", runID, "--pod", "not-a-pod"); code != 1 || !strings.Contains(errOut, "is not one of run "+runID+"'s pods") || !strings.Contains(errOut, head) {
		t.Errorf("logs --pod not-a-pod: exit %d %s", code, errOut)
	}
	if code, _, errOut := raydrop("logs", runID, "--container", "ray-head"); code != 2 || !strings.Contains(errOut, "go with --pod") {
		t.Errorf("logs --container without --pod: exit %d %s", code, errOut)
	}
	// The report: where it is, and the page itself.
	if code, out, errOut := raydrop("report", runID); code != 0 || strings.TrimSpace(out) != rec.Report || rec.Report == "" {
		t.Errorf("report: exit %d, %q (record: %q) %s", code, out, rec.Report, errOut)
	}
	page := t.TempDir() + "/report.html"
	if code, _, errOut := raydrop("report", runID, "-o", page); code != 0 || !strings.Contains(errOut, "written when the run ended") {
		t.Errorf("report -o: exit %d %s", code, errOut)
	} else if got, err := os.ReadFile(page); err != nil || !bytes.Contains(got, []byte(`id="phase">SUCCEEDED<`)) {
		t.Errorf("report -o wrote %d bytes (%v) without the run's phase", len(got), err)
	}
	// One shape: every key list prints is the record's, with its value.
	for _, l := range listed {
		if l["runId"] != runID {
			continue
		}
		for k, v := range l {
			sv, ok := status[k]
			if k == "updatedAt" {
				lt, _ := time.Parse(time.RFC3339Nano, v.(string))
				st, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(sv))
				ok = ok && lt.Equal(st)
			} else {
				ok = ok && fmt.Sprint(sv) == fmt.Sprint(v)
			}
			if !ok {
				t.Errorf("list --json has %s=%v, status --json %v", k, v, sv)
			}
		}
	}
	select {
	case got := <-evDone:
		if !strings.HasPrefix(got, "0\n") || strings.Count(got, "dev.raydrop.run.v1.") < 2 {
			t.Errorf("events: %s", got)
		}
	case <-time.After(60 * time.Second):
		t.Error("events printed fewer than 2 events")
	}
	select {
	case got := <-jsonDone:
		code, out, _ := strings.Cut(got, "\n")
		out, _, _ = strings.Cut(out, "\n")
		var ev struct {
			Type, Subject string
			Data          events.Run
		}
		if code != "0" || json.Unmarshal([]byte(out), &ev) != nil || ev.Type != events.Type("succeeded") || ev.Subject != "runs/"+runID || ev.Data.RunID != runID {
			t.Errorf("events --json --type succeeded: %s", got)
		}
		validateEnvelope(t, []byte(out))
	case <-time.After(60 * time.Second):
		t.Error("events --json --type succeeded printed nothing")
	}

	hang := upload(t, "cli-cancel", specFor(t, "e2e-cli-cancel", nil), "outcome=hang,at=2")
	waitPhase(t, hang, 60*time.Second, runs.Running)
	// A run still going has no report yet; one can be rendered from what
	// it has written so far.
	if code, _, errOut := raydrop("report", hang); code != 1 || !strings.Contains(errOut, "has no report yet") {
		t.Errorf("report of a running run: exit %d, %s", code, errOut)
	}
	if code, out, errOut := raydrop("report", hang, "-o", "-"); code != 0 || !strings.Contains(out, "The run has not ended") || !strings.Contains(out, `id="phase">RUNNING<`) {
		t.Errorf("report -o - of a running run: exit %d %s\n%.300s", code, errOut, out)
	}
	followed := make(chan string, 1)
	go func() {
		code, out, errOut := raydrop("logs", hang, "--follow", "--interval", "300ms")
		followed <- fmt.Sprintf("%d\n%s\n%s", code, out, errOut)
	}()
	if code, out, errOut := raydrop("cancel", hang); code != 0 {
		t.Fatalf("cancel: exit %d %s %s", code, out, errOut)
	}
	code, _, errOut = raydrop("watch", hang, "--interval", "300ms")
	if code != 1 || !strings.Contains(errOut, "CANCELLED") {
		t.Errorf("watch of a cancelled run: exit %d, %s", code, errOut)
	}
	// logs --follow printed the running attempt's lines and ended with it.
	select {
	case got := <-followed:
		if !strings.HasPrefix(got, "0\n") || !strings.Contains(got, "raydrop: run "+hang) || !strings.Contains(got, "'loss': ") {
			t.Errorf("logs --follow of a run cancelled meanwhile: %s", got)
		}
	case <-time.After(60 * time.Second):
		t.Error("logs --follow did not end with the cancelled run")
	}
	if code, _, errOut := raydrop("status", "no-such-run"); code != 1 || !strings.Contains(errOut, "no run or sweep no-such-run") {
		t.Errorf("status of an unknown run: exit %d, %s", code, errOut)
	}
}
