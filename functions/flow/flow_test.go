package flow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayfake "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned/fake"
	"google.golang.org/api/googleapi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/raydrop/raydrop/functions"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/gcstest"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/wiring"
)

const (
	intake = "raydrop-intake"
	state  = "raydrop-state"
	output = "my-project-raydrop-checkpoints"
)

// world is the pipeline over real in-memory fakes: fake-gcs-server's
// in-process server behind the real storage client, KubeRay's and
// Kubernetes' generated fake clientsets, and a bus that records every
// published message and delivers it to the function subscribed to its topic.
type world struct {
	t      *testing.T
	ctx    context.Context
	gcs    *storage.Client
	deps   *pipeline.Deps
	ray    *rayfake.Clientset
	kube   *kubefake.Clientset
	now    time.Time
	mu     sync.Mutex
	queue  []msg
	sent   map[string]int // topic → messages published
	events []event.Event  // public events, decoded
	drop   map[string]int // topic → messages to drop (a lost message)
	seq    int
	// current is the function handling the event being delivered: every
	// message it publishes must go to a topic the wiring table lists for it.
	current *wiring.Function
	// faulty: faults are injected, so transient failures are expected.
	faulty bool
}

type msg struct {
	topic string
	data  []byte
	attrs map[string]string
}

// TestMain turns the pacing of document writes off: these tests play the
// pipeline's logic on a virtual clock against an in-process Cloud Storage
// that enforces no write rate, and would otherwise wait a wall-clock second
// between writes of a record. The local cloud's Cloud Storage door enforces
// the rate, and its suites check the pacing.
func TestMain(m *testing.M) {
	gcsdoc.WriteInterval = 0
	os.Exit(m.Run())
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, ctx: context.Background(), gcs: gcstest.New(t, intake, state, output), now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), sent: map[string]int{}, drop: map[string]int{}}
	cfg, err := config.LoadConfig(func(k string) string {
		return map[string]string{"RAYDROP_PROJECT": "p", "RAYDROP_INTAKE_BUCKET": intake, "RAYDROP_STATE_BUCKET": state, "RAYDROP_KUBECONFIG": "unused", "RAYDROP_SCALE_DOWN_GRACE": "5m", "RAYDROP_OUTPUT_BUCKETS": output, "RAYDROP_DATA_BUCKETS": "team-data"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	w.ray = rayfake.NewSimpleClientset()
	w.kube = kubefake.NewSimpleClientset()
	clock := func() time.Time { return w.now }
	out := io.Discard
	if testing.Verbose() {
		out = os.Stderr
	}
	w.deps = pipeline.Assemble(cfg, pipeline.Clients{
		GCS: w.gcs, Publisher: w, Ray: w.ray, Kube: w.kube.CoreV1(), Clock: clock,
		Log: slog.New(&failOnSweepError{Handler: slog.NewTextHandler(out, nil), t: t, onlyPermanent: &w.faulty}),
	})
	return w
}

// failOnSweepError fails the test when a sweep reports a check that failed:
// the sweep logs such errors and goes on (the next tick tries again), so
// without this a step the sweep can never take would pass unseen.
// Where faults are injected (interleave_test.go), a check may fail for a
// while, so only a permanent failure fails the test there.
type failOnSweepError struct {
	slog.Handler
	t             *testing.T
	onlyPermanent *bool
}

func (h *failOnSweepError) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "sweep_check_failed" {
		var msg string
		permanent := false
		r.Attrs(func(a slog.Attr) bool {
			msg += " " + a.String()
			permanent = permanent || a.Key == "permanent" && a.Value.Bool()
			return true
		})
		if permanent || !*h.onlyPermanent {
			h.t.Errorf("sweep check failed:%s", msg)
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h *failOnSweepError) WithAttrs(as []slog.Attr) slog.Handler {
	return &failOnSweepError{Handler: h.Handler.WithAttrs(as), t: h.t, onlyPermanent: h.onlyPermanent}
}

func (h *failOnSweepError) WithGroup(name string) slog.Handler {
	return &failOnSweepError{Handler: h.Handler.WithGroup(name), t: h.t, onlyPermanent: h.onlyPermanent}
}

// Publish records a message for delivery (the Publisher of the functions).
func (w *world) Publish(_ context.Context, topic string, data []byte, attrs map[string]string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent[topic]++
	if f := w.current; f != nil && !w.publishes(*f, topic) {
		w.t.Errorf("%s published to %s, which the wiring table (wiring.Functions) does not list for it", f.Name, topic)
	}
	if topic == w.deps.Config.Topics.Events {
		e := event.New()
		e.SetID(attrs["ce-id"])
		e.SetType(attrs["ce-type"])
		_ = e.SetData("application/json", data)
		w.events = append(w.events, e)
		return nil
	}
	if w.drop[topic] > 0 {
		w.drop[topic]--
		return nil
	}
	w.queue = append(w.queue, msg{topic, data, attrs})
	return nil
}

func (w *world) pubsubEvent(topic string, data []byte, attrs map[string]string) event.Event {
	w.seq++
	return pipelinetest.PubSubEvent(fmt.Sprint(w.seq), topic, data, attrs)
}

// publishes reports whether the wiring table lets f publish to topic.
func (w *world) publishes(f wiring.Function, topic string) bool {
	for _, k := range f.Publishes {
		if w.deps.Config.Topics.Name(k) == topic {
			return true
		}
	}
	return false
}

// function is the function of the wiring table that topic delivers to: a
// topic's name, or "intake" for the intake bucket's object notifications.
func (w *world) function(topic string) (wiring.Function, bool) {
	for _, f := range wiring.Functions {
		for _, tr := range f.Triggers {
			switch {
			case tr.Topic != "" && w.deps.Config.Topics.Name(tr.Topic) == topic,
				tr.Bucket == wiring.BucketIntake && topic == "intake":
				return f, true
			}
		}
	}
	return wiring.Function{}, false
}

// handler is the handler of a function of the wiring table.
func (w *world) handler(name string) functions.Handler {
	build, ok := functions.Handlers[name]
	if !ok {
		w.t.Fatalf("function %s of the wiring table has no handler", name)
	}
	return build(w.deps)
}

// deliver runs one event through the function the wiring table subscribes
// to topic and returns the handler's error as it is. The platform would
// acknowledge a permanent error and drop the event, so a permanent error
// fails every caller that does not expect exactly that: a dropped step
// cannot pass.
func (w *world) deliver(topic string, e event.Event) error {
	f, ok := w.function(topic)
	if !ok {
		w.t.Fatalf("no function on topic %s", topic)
	}
	w.mu.Lock()
	w.current = &f
	w.mu.Unlock()
	err := w.handler(f.Name).Handle(w.ctx, e)
	w.mu.Lock()
	w.current = nil
	w.mu.Unlock()
	if pipeline.IsPermanent(err) {
		return fmt.Errorf("permanent error, the event would be dropped: %w", err)
	}
	return err
}

// drain delivers queued messages until none is left.
func (w *world) drain() {
	w.t.Helper()
	for i := 0; i < 200; i++ {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		m := w.queue[0]
		w.queue = w.queue[1:]
		w.mu.Unlock()
		if err := w.deliver(m.topic, w.pubsubEvent(m.topic, m.data, m.attrs)); err != nil {
			w.t.Fatalf("deliver %s %s: %v", m.topic, m.data, err)
		}
	}
	w.t.Fatal("messages kept coming")
}

func (w *world) upload(name, body string) event.Event {
	w.t.Helper()
	return pipelinetest.Upload(w.t, w.gcs, intake, name, body)
}

// admit uploads a spec, delivers its intake event and drains the chain; it
// returns the run ID.
func (w *world) admit(name, body string) string {
	w.t.Helper()
	e := w.upload(name, body)
	if err := w.deliver("intake", e); err != nil {
		w.t.Fatal(err)
	}
	w.drain()
	return names.RunIDFromObject(intake, name, mustGen(w.t, e))
}

func (w *world) tick() {
	w.t.Helper()
	if err := w.deliver(w.deps.Config.Topics.Ticks, w.pubsubEvent(w.deps.Config.Topics.Ticks, []byte("tick"), nil)); err != nil {
		w.t.Fatal(err)
	}
	w.drain()
}

func (w *world) record(runID string) *runs.Record {
	w.t.Helper()
	r, err := w.deps.Runs.Get(w.ctx, runID)
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

// setJob sets a RayJob's status as KubeRay would.
func (w *world) setJob(runID string, attempt int, dep rayv1.JobDeploymentStatus, js rayv1.JobStatus) {
	w.t.Helper()
	jobs := w.ray.RayV1().RayJobs("default")
	j, err := jobs.Get(w.ctx, names.RayJob(runID, attempt), metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	j.Status.JobDeploymentStatus, j.Status.JobStatus = dep, js
	if _, err := jobs.UpdateStatus(w.ctx, j, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	if js == rayv1.JobStatusRunning {
		w.runWorkers(j.Spec.ClusterSelector[names.LabelRayCluster], 2)
	}
}

// runWorkers makes n worker pods of the cluster run, as KubeRay and the
// kubelet would once the nodes are there (the example spec's 16 workers
// need 2 pods of 8 GPUs).
func (w *world) runWorkers(cluster string, n int) {
	w.t.Helper()
	pods := w.kube.CoreV1().Pods("default")
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-worker-%d", cluster, i), Labels: map[string]string{names.LabelRayCluster: cluster, names.LabelRayNodeType: "worker"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-worker", Image: "rayproject/ray:2.48.0-gpu"}}},
		}
		created, err := pods.Create(w.ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			w.t.Fatal(err)
		}
		created.Status.Phase = corev1.PodRunning
		if _, err := pods.UpdateStatus(w.ctx, created, metav1.UpdateOptions{}); err != nil {
			w.t.Fatal(err)
		}
	}
}

// writeLayout writes what the trainer writes for an attempt: one checkpoint
// per epoch, result.json, and the completion mark (status "" for none).
func (w *world) writeLayout(runID string, attempt, epochs int, status string) {
	w.t.Helper()
	exp := fmt.Sprintf("raydrop/%s/attempt-%d", runID, attempt)
	trial := exp + "/TorchTrainer_abcde_00000_0_2026-11-30_10-00-00"
	var lines []string
	for e := 0; e < epochs; e++ {
		ck := fmt.Sprintf("checkpoint_%06d", e)
		for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
			w.put(output, trial+"/"+ck+"/checkpoint/"+f, "x")
		}
		lines = append(lines, fmt.Sprintf(`{"step": %d, "epoch": %d, "loss": %g, "checkpoint_dir_name": %q}`, (e+1)*10, e+1, 2.0-float64(e)*0.5, ck))
	}
	w.put(output, trial+"/result.json", strings.Join(lines, "\n")+"\n")
	if status != "" {
		errText := "null"
		if status == "failed" {
			errText = `"ValueError: bad data"`
		}
		w.put(output, exp+"/raydrop_result.json", fmt.Sprintf(`{"status": %q, "error": %s, "finalMetrics": {"train_loss": 1.1, "train_runtime": 30}}`, status, errText))
	}
}

func (w *world) put(bucket, name, body string) {
	wr := w.gcs.Bucket(bucket).Object(name).NewWriter(w.ctx)
	_, _ = io.WriteString(wr, body)
	if err := wr.Close(); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) count(eventType string) int {
	n := 0
	for _, e := range w.events {
		if e.Type() == "dev.raydrop.run.v1."+eventType {
			n++
		}
	}
	return n
}

// types lists the public events of a run, in the order they went out, by
// the phase they announce.
func (w *world) types(runID string) []string {
	var out []string
	for _, e := range w.eventsOf(runID) {
		out = append(out, strings.TrimPrefix(e.Type(), "dev.raydrop.run.v1."))
	}
	return out
}

func (w *world) rayJobs() int {
	l, err := w.ray.RayV1().RayJobs("default").List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return len(l.Items)
}

func (w *world) workers() int32 {
	rc, err := w.ray.RayV1().RayClusters("default").Get(w.ctx, "gemma3-tuning", metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var n int32
	for _, g := range rc.Spec.WorkerGroupSpecs {
		n += *g.Replicas + *g.MinReplicas
	}
	return n
}

// example is the example spec with the data check off: most tests drive
// the phases after it (checkedExample turns it on).
func example(t *testing.T) string {
	b, err := os.ReadFile("../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), `"cluster": {`, `"dataset": {"check": false}, "cluster": {`, 1)
	if body == string(b) {
		t.Fatal("the example has no cluster to put the dataset before")
	}
	return body
}

// runToSuccess takes an admitted, submitted run through running to a
// succeeded completion mark.
func (w *world) runToSuccess(runID string, attempt int) {
	w.setJob(runID, attempt, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLayout(runID, attempt, 3, "succeeded")
	w.tick()
}

func TestSuccessWithDuplicateDeliveries(t *testing.T) {
	w := newWorld(t)
	e := w.upload("jobs/gemma3-vision.json", example(t))
	for range 5 {
		if err := w.deliver("intake", e); err != nil {
			t.Fatal(err)
		}
	}
	w.drain()
	runID := names.RunIDFromObject(intake, "jobs/gemma3-vision.json", mustGen(t, e))
	if got := w.record(runID).Phase; got != runs.Submitted {
		t.Fatalf("phase %s, want SUBMITTED", got)
	}
	w.runToSuccess(runID, 1)
	// Redeliver everything once more: nothing new may happen.
	for range 5 {
		_ = w.deliver("intake", e)
	}
	w.mu.Lock()
	w.queue = append(w.queue, msg{w.deps.Config.Topics.Finished, []byte(`{"runId":"` + runID + `","attempt":1}`), nil})
	w.mu.Unlock()
	w.drain()
	w.tick()

	r := w.record(runID)
	if r.Phase != runs.Succeeded {
		t.Fatalf("phase %s (%s), want SUCCEEDED", r.Phase, r.Message)
	}
	if w.rayJobs() != 1 || w.count("accepted") != 1 || w.count("running") != 1 || w.count("succeeded") != 1 {
		t.Errorf("rayjobs %d accepted %d running %d succeeded %d; want 1 each", w.rayJobs(), w.count("accepted"), w.count("running"), w.count("succeeded"))
	}
	if len(r.Result.Checkpoints) != 3 || r.Result.Latest == nil || r.Result.Best.Name != "checkpoint_000002" {
		t.Errorf("result %+v", r.Result)
	}
	if w.workers() != 0 {
		t.Errorf("workers %d after the run, want 0", w.workers())
	}
	var data, reported map[string]any
	_ = json.Unmarshal(w.terminalEvent(runID).Data(), &data)
	for _, k := range []string{"checkpoints", "latestCheckpoint", "bestCheckpoint", "finalMetrics", "timings", "gpuHours", "estimatedCostUsd"} {
		if _, ok := data[k]; !ok {
			t.Errorf("succeeded event lacks %s", k)
		}
	}
	if _, ok := data["report"]; ok {
		t.Errorf("the succeeded event names report %v: it went out before the report was written", data["report"])
	}
	// The report was written once, beside the run, whatever was
	// redelivered, and announced once, after the terminal event.
	uri := "gs://" + output + "/raydrop/" + runID + "/report.html"
	_ = json.Unmarshal(w.reportEvent(runID).Data(), &reported)
	if reported["report"] != uri || reported["outcome"] != "succeeded" || r.Report != uri || w.count(events.ReportReady) != 1 {
		t.Errorf("report %v in its event (outcome %v, %d such events), %q in the record; want %s once", reported["report"], reported["outcome"], w.count(events.ReportReady), r.Report, uri)
	}
	a, err := w.gcs.Bucket(output).Object("raydrop/" + runID + "/report.html").Attrs(w.ctx)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if a.ContentType != "text/html; charset=utf-8" || a.Metageneration != 1 || a.Size < 1000 {
		t.Errorf("report object %s, metageneration %d, %d bytes", a.ContentType, a.Metageneration, a.Size)
	}
}

func mustGen(t *testing.T, e event.Event) int64 {
	var o pipeline.StorageObject
	if err := json.Unmarshal(e.Data(), &o); err != nil {
		t.Fatal(err)
	}
	return int64(o.Generation)
}

func TestRejectedSpec(t *testing.T) {
	w := newWorld(t)
	e := w.upload("jobs/bad.json", `{"apiVersion":"raydrop.dev/v1","training":{"epoch":3},"output":{"bucket":"x"}}`)
	for range 3 {
		if err := w.deliver("intake", e); err != nil {
			t.Fatal(err)
		}
	}
	r := w.record(names.RunIDFromObject(intake, "jobs/bad.json", mustGen(t, e)))
	if r.Phase != runs.Rejected || len(r.Problems) < 3 {
		t.Fatalf("phase %s problems %v", r.Phase, r.Problems)
	}
	paths := map[string]bool{}
	for _, p := range r.Problems {
		paths[p.Path] = true
	}
	for _, p := range []string{"training.epoch", "cluster.serviceAccount", "cluster.reservation", "output.bucket"} {
		if !paths[p] {
			t.Errorf("no problem named %s: %v", p, r.Problems)
		}
	}
	if w.count("rejected") != 1 || w.rayJobs() != 0 {
		t.Errorf("rejected events %d, rayjobs %d", w.count("rejected"), w.rayJobs())
	}
}

func TestIgnoredObjects(t *testing.T) {
	w := newWorld(t)
	for _, name := range []string{"runs/x/notes.json", "clusters/default/c.json", "jobs/../x.json", "jobs/x.yaml", "other.json"} {
		if err := w.deliver("intake", w.upload(name, "{}")); err != nil {
			t.Fatal(err)
		}
	}
	if sums, _ := w.deps.Runs.List(w.ctx); len(sums) != 0 || len(w.events) != 0 {
		t.Errorf("ignored objects made runs %v or events %d", sums, len(w.events))
	}
}

func TestQueueBehindHolder(t *testing.T) {
	w := newWorld(t)
	a := w.upload("jobs/a.json", example(t))
	b := w.upload("jobs/b.json", example(t))
	_ = w.deliver("intake", a)
	_ = w.deliver("intake", b)
	w.drain()
	ra, rb := names.RunIDFromObject(intake, "jobs/a.json", mustGen(t, a)), names.RunIDFromObject(intake, "jobs/b.json", mustGen(t, b))
	if w.record(ra).Phase != runs.Submitted || w.record(rb).Phase != runs.Queued {
		t.Fatalf("phases %s %s, want SUBMITTED QUEUED", w.record(ra).Phase, w.record(rb).Phase)
	}
	w.runToSuccess(ra, 1)
	if w.record(rb).Phase != runs.Submitted {
		t.Fatalf("second run %s after the first ended, want SUBMITTED", w.record(rb).Phase)
	}
	if w.workers() == 0 {
		t.Error("workers went to zero between the two runs")
	}
	w.runToSuccess(rb, 1)
	if w.record(rb).Phase != runs.Succeeded || w.workers() != 0 || w.count("queued") != 1 {
		t.Errorf("second run %s, workers %d, queued events %d", w.record(rb).Phase, w.workers(), w.count("queued"))
	}
}

func TestCancel(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/c.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	if err := w.deliver(w.deps.Config.Topics.Requests, w.pubsubEvent(w.deps.Config.Topics.Requests, nil, map[string]string{"action": "cancel", "runId": runID})); err != nil {
		t.Fatal(err)
	}
	w.drain()
	if r := w.record(runID); r.Phase != runs.Cancelled || w.rayJobs() != 0 || w.count("cancelled") != 1 || w.workers() != 0 {
		t.Errorf("phase %s, rayjobs %d, cancelled events %d, workers %d", r.Phase, w.rayJobs(), w.count("cancelled"), w.workers())
	}
}

func TestInfraFailureRetriesAndResumes(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/r.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLayout(runID, 1, 1, "") // one checkpoint, then the head is lost: no mark
	w.setJob(runID, 1, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	w.tick()
	r := w.record(runID)
	if r.Attempt != 2 || r.Phase != runs.Submitted {
		t.Fatalf("attempt %d phase %s, want attempt 2 SUBMITTED", r.Attempt, r.Phase)
	}
	if a := r.CurrentAttempt(); !strings.HasSuffix(a.ResumeFrom, "attempt-1/TorchTrainer_abcde_00000_0_2026-11-30_10-00-00/checkpoint_000000/checkpoint") {
		t.Errorf("attempt 2 resumes from %q", a.ResumeFrom)
	}
	j, err := w.ray.RayV1().RayJobs("default").Get(w.ctx, names.RayJob(runID, 2), metav1.GetOptions{})
	if err != nil || !strings.Contains(j.Spec.Entrypoint, "--resume-from gs://"+output) {
		t.Fatalf("attempt 2 RayJob: %v %v", err, j)
	}
	w.runToSuccess(runID, 2)
	if r := w.record(runID); r.Phase != runs.Succeeded || len(r.Result.Checkpoints) != 4 || w.count("succeeded") != 1 {
		t.Errorf("phase %s, checkpoints %d, succeeded events %d", r.Phase, len(r.Result.Checkpoints), w.count("succeeded"))
	}
}

func TestApplicationFailureIsNotRetried(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/f.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.writeLayout(runID, 1, 0, "failed")
	w.tick()
	r := w.record(runID)
	if r.Phase != runs.Failed || r.Attempt != 1 || r.Reason != runs.ApplicationError || !strings.Contains(r.Message, "ValueError: bad data") || w.count("failed") != 1 || w.workers() != 0 {
		t.Errorf("phase %s attempt %d reason %s %q failed events %d workers %d", r.Phase, r.Attempt, r.Reason, r.Message, w.count("failed"), w.workers())
	}
}

func TestDeadlineAndLostFinished(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/h.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.drop[w.deps.Config.Topics.Finished] = 1 // the finished message is lost
	w.now = w.now.Add(25 * time.Hour)
	w.tick()
	if r := w.record(runID); r.Phase != runs.Finishing {
		t.Fatalf("phase %s after the deadline, want FINISHING (its message was dropped)", r.Phase)
	}
	w.now = w.now.Add(2 * time.Minute)
	w.tick() // the sweep resends finished
	r := w.record(runID)
	if r.Phase != runs.Failed || r.Reason != runs.DeadlineExceeded || w.rayJobs() != 0 || w.count("failed") != 1 || w.workers() != 0 {
		t.Errorf("phase %s reason %s rayjobs %d failed events %d workers %d", r.Phase, r.Reason, w.rayJobs(), w.count("failed"), w.workers())
	}
}

// TestStalledStepResentOncePerStaleStep: however often ticks come, the
// sweep resends a stalled step's message once per StaleStep, not on every
// tick, so copies never pile up in front of it.
func TestStalledStepResentOncePerStaleStep(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/s.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	finished := w.deps.Config.Topics.Finished
	w.drop[finished] = 2 // the finished message and its first resend are lost
	w.now = w.now.Add(25 * time.Hour)
	w.tick() // deadline: FINISHING, finished sent (lost)
	w.now = w.now.Add(runs.StaleStep + time.Second)
	w.tick() // stale: resent (lost)
	for range 5 {
		w.now = w.now.Add(runs.StaleStep / 8)
		w.tick() // frequent ticks: nothing more until a full StaleStep passed
	}
	if got := w.sent[finished]; got != 2 {
		t.Fatalf("finished sent %d times within StaleStep of the resend, want 2 (original and one resend)", got)
	}
	w.now = w.now.Add(runs.StaleStep / 2)
	w.tick() // stale again: resent, delivered
	if got, r := w.sent[finished], w.record(runID); got != 3 || r.Phase != runs.Failed {
		t.Errorf("finished sent %d times, phase %s; want 3 and FAILED", got, r.Phase)
	}
}

// TestStalledAcceptedRunIsAnnouncedAndAdmitted: the intake delivery died
// right after claiming the accepted event and was never redelivered. The
// sweep announces the run once its claim expired and admits it.
func TestStalledAcceptedRunIsAnnouncedAndAdmitted(t *testing.T) {
	w := newWorld(t)
	w.stalled("stalled")
	w.tick() // fresh: nothing yet
	if w.count("accepted") != 0 || w.record("stalled").Phase != runs.Accepted {
		t.Fatalf("acted on a run whose intake may still be at work: %d accepted events, phase %s", w.count("accepted"), w.record("stalled").Phase)
	}
	w.now = w.now.Add(2 * time.Minute)
	w.tick()
	if r := w.record("stalled"); w.count("accepted") != 1 || r.Phase != runs.Submitted || w.rayJobs() != 1 {
		t.Errorf("after the sweep: %d accepted events, phase %s, %d RayJobs; want 1, SUBMITTED, 1", w.count("accepted"), r.Phase, w.rayJobs())
	}
}

func (w *world) cancel(runID string) {
	w.t.Helper()
	if err := w.deliver(w.deps.Config.Topics.Requests, w.pubsubEvent(w.deps.Config.Topics.Requests, nil, map[string]string{"action": "cancel", "runId": runID})); err != nil {
		w.t.Fatal(err)
	}
	w.drain()
}

func (w *world) lease() *pipeline.Lease {
	w.t.Helper()
	l, err := withWaiting(w.ctx, w.deps.Leases, "default", "gemma3-tuning")
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// withWaiting reads a lease, with Queue listing every run that waits for
// the cluster (Leases.Waiting), for the tests' checks.
func withWaiting(ctx context.Context, store pipeline.LeaseStore, namespace, cluster string) (*pipeline.Lease, error) {
	l, err := store.Get(ctx, namespace, cluster)
	if err != nil {
		return nil, err
	}
	l.Queue, err = store.(*pipeline.Leases).Waiting(ctx, namespace, cluster)
	return l, err
}

// TestCancelWhileQueued: a run queued behind another is cancelled, then the
// first is cancelled, then a third run on the same cluster runs at once and
// the workers go to zero after it. The cancelled queued run never had an
// attempt: its finished message says attempt 0.
func TestCancelWhileQueued(t *testing.T) {
	w := newWorld(t)
	a := w.admit("jobs/a.json", example(t))
	b := w.admit("jobs/b.json", example(t))
	if w.record(a).Phase != runs.Submitted || w.record(b).Phase != runs.Queued {
		t.Fatalf("phases %s %s, want SUBMITTED QUEUED", w.record(a).Phase, w.record(b).Phase)
	}
	w.cancel(b)
	if r := w.record(b); r.Phase != runs.Cancelled || w.count("cancelled") != 1 {
		t.Fatalf("queued run after cancel: phase %s (%s), %d cancelled events; want CANCELLED, 1", r.Phase, r.Message, w.count("cancelled"))
	}
	if l := w.lease(); l.Holder != a || len(l.Queue) != 0 {
		t.Fatalf("lease %+v after the queued run was cancelled, want held by %s, nobody queued", l, a)
	}
	w.setJob(a, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.cancel(a)
	if r := w.record(a); r.Phase != runs.Cancelled || w.workers() != 0 || w.rayJobs() != 0 {
		t.Fatalf("first run: phase %s, workers %d, rayjobs %d; want CANCELLED, 0, 0", r.Phase, w.workers(), w.rayJobs())
	}
	c := w.admit("jobs/c.json", example(t))
	if r := w.record(c); r.Phase != runs.Submitted {
		t.Fatalf("third run %s (%s), want SUBMITTED", r.Phase, r.Message)
	}
	w.runToSuccess(c, 1)
	if r := w.record(c); r.Phase != runs.Succeeded || w.workers() != 0 || w.count("cancelled") != 2 || w.count("succeeded") != 1 {
		t.Errorf("third run %s, workers %d, cancelled events %d, succeeded events %d; want SUCCEEDED, 0, 2, 1", r.Phase, w.workers(), w.count("cancelled"), w.count("succeeded"))
	}
}

// TestCancelWhileAccepted: a run cancelled before it was admitted (its
// record ACCEPTED, no attempt) ends CANCELLED and takes no cluster. Its
// intake delivery died before announcing it, so finalize announces it
// first: subscribers get accepted, then cancelled, as for every run.
func TestCancelWhileAccepted(t *testing.T) {
	w := newWorld(t)
	rec := w.stalled("accepted-then-cancelled")
	w.now = w.now.Add(pipeline.ClaimFor + time.Second) // the dead delivery's claim expired
	w.cancel(rec.RunID)
	if r := w.record(rec.RunID); r.Phase != runs.Cancelled || r.Reason != runs.ReasonCancelled || w.count("cancelled") != 1 || w.rayJobs() != 0 {
		t.Fatalf("phase %s (%s: %s), cancelled events %d, rayjobs %d; want CANCELLED (Cancelled), 1, 0", r.Phase, r.Reason, r.Message, w.count("cancelled"), w.rayJobs())
	}
	if got := w.types(rec.RunID); !slices.Equal(got, []string{"accepted", "cancelled", events.ReportReady}) {
		t.Errorf("events %v, want accepted then cancelled (then the report's)", got)
	}
	if l := w.lease(); l.Holder != "" || len(l.Queue) != 0 {
		t.Errorf("lease %+v after a cancelled accepted run, want free", l)
	}
}

// TestQueuedRunCancelledWhileItsFinishIsLost: the cancelled queued run's
// finished message is lost, the first run ends and hands the cluster to
// it; a third run queues behind it. The sweep finalizes the cancelled run,
// which passes the cluster to the third.
func TestQueuedRunCancelledWhileItsFinishIsLost(t *testing.T) {
	w := newWorld(t)
	a := w.admit("jobs/a.json", example(t))
	b := w.admit("jobs/b.json", example(t))
	w.drop[w.deps.Config.Topics.Finished] = 1
	w.cancel(b)
	if r := w.record(b); r.Phase != runs.Finishing {
		t.Fatalf("cancelled queued run %s, want FINISHING (its finished message was lost)", r.Phase)
	}
	w.runToSuccess(a, 1)
	c := w.admit("jobs/c.json", example(t))
	if r := w.record(c); r.Phase != runs.Queued {
		t.Fatalf("third run %s, want QUEUED behind the cancelled run", r.Phase)
	}
	w.now = w.now.Add(runs.StaleStep + time.Second)
	w.tick()
	if r := w.record(b); r.Phase != runs.Cancelled || w.count("cancelled") != 1 {
		t.Fatalf("cancelled run %s, %d cancelled events; want CANCELLED, 1", r.Phase, w.count("cancelled"))
	}
	if r := w.record(c); r.Phase != runs.Submitted {
		t.Fatalf("third run %s (%s), want SUBMITTED", r.Phase, r.Message)
	}
	w.runToSuccess(c, 1)
	if r := w.record(c); r.Phase != runs.Succeeded || w.workers() != 0 {
		t.Errorf("third run %s, workers %d; want SUCCEEDED, 0", r.Phase, w.workers())
	}
}

// TestEndedRunAnnouncedAfterFinalizeDied: finalize recorded the end of a
// run and died before releasing the cluster and announcing it, and its
// message was not redelivered. The sweep sends the run to finalize again
// once it is StaleStep old: one terminal event, workers to zero. A rejected
// run whose intake died before announcing it is announced the same way.
func TestEndedRunAnnouncedAfterFinalizeDied(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/e.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.writeLayout(runID, 1, 3, "succeeded")
	w.drop[w.deps.Config.Topics.Finished] = 1
	w.tick() // FINISHING; the finished message is lost
	if _, err := w.deps.Runs.Update(w.ctx, runID, func(r *runs.Record) error {
		// what finalize wrote before it died
		return r.MarkEnded(&checkpoints.Result{Latest: &checkpoints.Checkpoint{Name: "checkpoint_000002"}}, nil, w.now)
	}); err != nil {
		t.Fatal(err)
	}
	rejected := runs.NewRecord("rejected-unannounced", "gs://intake/jobs/bad.json#1", "bad", nil, spec.Problems{{Path: "$", Message: "not JSON"}}, w.now)
	if err := w.deps.Runs.Create(w.ctx, rejected); err != nil {
		t.Fatal(err)
	}
	w.tick()
	if w.count("succeeded") != 0 || w.count("rejected") != 0 {
		t.Fatalf("announced before StaleStep passed: %d succeeded, %d rejected", w.count("succeeded"), w.count("rejected"))
	}
	w.now = w.now.Add(runs.StaleStep + time.Second)
	w.tick()
	w.now = w.now.Add(runs.StaleStep + time.Second)
	w.tick()
	if w.count("succeeded") != 1 || w.count("rejected") != 1 || w.workers() != 0 {
		t.Errorf("%d succeeded and %d rejected events, %d workers; want 1, 1, 0", w.count("succeeded"), w.count("rejected"), w.workers())
	}
	for _, id := range []string{runID, rejected.RunID} {
		if r := w.record(id); r.Unannounced() {
			t.Errorf("run %s still unannounced (%s, published %v)", id, r.Phase, r.Published)
		}
	}
	// The delivery that announced the run wrote its report; a rejected
	// spec names no bucket for one.
	if r := w.record(runID); r.Report == "" {
		t.Error("the run announced after finalize died has no report")
	}
	if r := w.record(rejected.RunID); r.Report != "" {
		t.Errorf("the rejected run has report %s", r.Report)
	}
}

// stalled records an accepted run as an intake delivery that died right
// after claiming its accepted event leaves it: no event, no cluster.
func (w *world) stalled(runID string) *runs.Record {
	w.t.Helper()
	s, err := spec.Parse([]byte(example(w.t)))
	if err != nil {
		w.t.Fatal(err)
	}
	now := w.deps.Time()
	rec := runs.NewRecord(runID, "gs://intake/jobs/"+runID+".json#1", s.Name, s, nil, now)
	rec.Publishing = map[runs.Phase]time.Time{runs.Accepted: now}
	if err := w.deps.Runs.Create(w.ctx, rec); err != nil {
		w.t.Fatal(err)
	}
	return rec
}

// TestTimingsCountEveryAttempt: a retried run's time in each phase adds up
// every entry into it, so the second attempt's wait in SUBMITTED counts as
// SUBMITTED, not as RUNNING.
func TestTimingsCountEveryAttempt(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/t.json", example(t))
	w.now = w.now.Add(5 * time.Minute)
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.now = w.now.Add(time.Hour)
	w.writeLayout(runID, 1, 1, "")
	w.setJob(runID, 1, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	w.tick() // retried: attempt 2 SUBMITTED
	w.now = w.now.Add(10 * time.Minute)
	w.setJob(runID, 2, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	w.now = w.now.Add(30 * time.Minute)
	w.writeLayout(runID, 2, 3, "succeeded")
	w.tick()
	var data struct {
		Timings map[string]float64 `json:"timings"`
	}
	if err := json.Unmarshal(w.terminalEvent(runID).Data(), &data); err != nil || w.record(runID).Phase != runs.Succeeded {
		t.Fatalf("phase %s: %v", w.record(runID).Phase, err)
	}
	want := map[string]float64{"ACCEPTED": 0, "PROVISIONED": 0, "SUBMITTED": 15 * 60, "RUNNING": 90 * 60, "FINISHING": 0, "total": 105 * 60}
	for k, v := range want {
		if data.Timings[k] != v {
			t.Errorf("timings[%s] = %v, want %v (all: %v)", k, data.Timings[k], v, data.Timings)
		}
	}
}

// TestOutsideTheDeploymentRejected: a spec naming a checkpoint bucket or
// a namespace the deployment gives its functions no access to is REJECTED
// at admission, with the problem at its field naming what is allowed, and
// nothing is created.
func TestOutsideTheDeploymentRejected(t *testing.T) {
	for _, c := range []struct{ name, old, new, path, allowed string }{
		{"bucket", `"bucket": "` + output + `"`, `"bucket": "someone-elses-bucket"`, "output.bucket", output},
		{"namespace", `"cluster": {`, `"cluster": {"namespace": "kube-system",`, "cluster.namespace", `runs may use default`},
		{"data bucket", `"dataset": {"check": false}`, `"dataset": {"check": false, "source": "gs://someone-elses-data/x"}`, "dataset.source", `bucket "someone-elses-data" is not a data bucket of this deployment; runs may read data from team-data`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			body := strings.Replace(example(t), c.old, c.new, 1)
			if body == example(t) {
				t.Fatalf("the example has no %s to replace", c.old)
			}
			runID := w.admit("jobs/foreign.json", body)
			r := w.record(runID)
			if r.Phase != runs.Rejected || r.Reason != runs.InvalidSpec || len(r.Problems) != 1 || r.Problems[0].Path != c.path ||
				!strings.Contains(r.Problems[0].Message, c.allowed) || w.count("rejected") != 1 || w.rayJobs() != 0 {
				t.Errorf("phase %s reason %s problems %v, rejected events %d, rayjobs %d", r.Phase, r.Reason, r.Problems, w.count("rejected"), w.rayJobs())
			}
		})
	}
}

// deniedBucket answers every request for one bucket with Cloud Storage's
// 403, as for a bucket the functions' identity has no role on.
type deniedBucket struct {
	pipeline.Objects
	bucket string
}

func (d deniedBucket) Bucket(b string) checkpoints.Store {
	if b == d.bucket {
		return deniedStore{d.Objects.Bucket(b)}
	}
	return d.Objects.Bucket(b)
}

func (d deniedBucket) Create(ctx context.Context, b, name string, data []byte, contentType string) error {
	if b == d.bucket {
		return errDenied
	}
	return d.Objects.Create(ctx, b, name, data, contentType)
}

type deniedStore struct{ checkpoints.Store }

var errDenied = &googleapi.Error{Code: http.StatusForbidden, Message: "caller does not have storage.objects.get access"}

func (deniedStore) List(context.Context, string) ([]string, error)      { return nil, errDenied }
func (deniedStore) Read(context.Context, string, int64) ([]byte, error) { return nil, errDenied }

// TestUnreadableCheckpointsEndTheRun: when the functions cannot read what
// a run wrote (403 on its bucket), the run still ends, FAILED with reason
// CheckpointsUnreadable, its cluster is released and its workers go to
// zero; the next run on the cluster goes ahead. The monitor gives up on a
// running job whose mark it cannot read; finalize ends a finished one.
func TestUnreadableCheckpointsEndTheRun(t *testing.T) {
	for _, when := range []string{"running", "finishing"} {
		t.Run(when, func(t *testing.T) {
			w := newWorld(t)
			a := w.admit("jobs/a.json", example(t))
			b := w.admit("jobs/b.json", example(t))
			w.setJob(a, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
			w.tick()
			if when == "finishing" {
				w.writeLayout(a, 1, 2, "succeeded")
				w.drop[w.deps.Config.Topics.Finished] = 1
				w.tick() // FINISHING; its finished message is lost until the bucket turns unreadable
			}
			w.deps.Objects = deniedBucket{w.deps.Objects, output}
			w.now = w.now.Add(runs.StaleStep + time.Second)
			w.tick()
			for _, id := range []string{a, b} {
				// b was handed the cluster, then met the same bucket.
				r := w.record(id)
				if r.Phase != runs.Failed || r.Reason != runs.CheckpointsUnreadable || r.Attempt != 1 || !strings.Contains(r.Message, "403") {
					t.Errorf("run %s: phase %s reason %s attempt %d %q; want FAILED CheckpointsUnreadable on attempt 1", id, r.Phase, r.Reason, r.Attempt, r.Message)
				}
				if got := w.types(id); got[len(got)-1] != "failed" {
					t.Errorf("run %s events %v, want failed last", id, got)
				}
				// The report cannot be written either: the event does not wait for it.
				if r.Report != "" {
					t.Errorf("run %s has report %s in a bucket it may not write", id, r.Report)
				}
			}
			if w.workers() != 0 || w.lease().Holder != "" {
				t.Errorf("workers %d, lease %+v after both runs ended; want 0 and free", w.workers(), w.lease())
			}
		})
	}
}

// TestSpecsInSubFolders: a spec in a sub-folder of jobs/ runs like any
// other; a name with an empty, "." or ".." folder starts nothing. The
// pipeline's records and leases are in the state bucket, none in the
// intake bucket.
func TestSpecsInSubFolders(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/team-a/nested/gemma.json", example(t))
	w.runToSuccess(runID, 1)
	if r := w.record(runID); r.Phase != runs.Succeeded || r.Name != "gemma3-vision" {
		t.Errorf("phase %s name %q", r.Phase, r.Name)
	}
	for _, name := range []string{"jobs/../x.json", "jobs//x.json", "jobs/./x.json", "jobs/a/.json/"} {
		if err := w.deliver("intake", w.upload(name, example(t))); err != nil {
			t.Fatal(err)
		}
	}
	w.drain()
	if n := w.count("accepted"); n != 1 {
		t.Errorf("%d accepted events, want 1 (the sub-folder spec's)", n)
	}
	it := w.gcs.Bucket(intake).Objects(w.ctx, nil)
	for {
		a, err := it.Next()
		if err != nil {
			break
		}
		if !strings.HasPrefix(a.Name, "jobs/") {
			t.Errorf("the pipeline wrote %s to the intake bucket", a.Name)
		}
	}
}

// TestMarkNoticeFinishesTheRun: the checkpoint bucket's notification of a
// mark notice (the only objects it announces) sends a finished run to
// finalize with no tick; a deletion, or an object that is no notice, wakes
// Monitor for nothing.
func TestMarkNoticeFinishesTheRun(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/gemma3-vision.json", example(t))
	w.setJob(runID, 1, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.writeLayout(runID, 1, 3, "succeeded")
	topic := w.deps.Config.Topics.Marks
	notify := func(event, object string) {
		t.Helper()
		e := w.pubsubEvent(topic, []byte(`{}`), map[string]string{"eventType": event, "bucketId": output, "objectId": object, "payloadFormat": "JSON_API_V1"})
		if err := w.deliver(topic, e); err != nil {
			t.Fatal(err)
		}
		w.drain()
	}
	notify("OBJECT_DELETE", names.MarkNotice(runID, 1))
	notify("OBJECT_FINALIZE", "raydrop/"+runID+"/attempt-1/raydrop_result.json")
	if got := w.record(runID).Phase; got != runs.Submitted {
		t.Fatalf("phase %s after notifications that announce nothing, want SUBMITTED", got)
	}
	notify("OBJECT_FINALIZE", names.MarkNotice(runID, 1))
	if r := w.record(runID); r.Phase != runs.Succeeded || w.count("succeeded") != 1 {
		t.Errorf("phase %s, succeeded events %d, want SUCCEEDED after the notice alone", r.Phase, w.count("succeeded"))
	}
}

// lastEvent is the last public event of a run.
// terminalEvent is the run's terminal event.
func (w *world) terminalEvent(runID string) event.Event {
	w.t.Helper()
	for _, e := range w.eventsOf(runID) {
		if p, ok := runs.PhaseOfEvent(strings.TrimPrefix(e.Type(), events.TypePrefix)); ok && p.Terminal() {
			return e
		}
	}
	w.t.Fatalf("run %s has no terminal event", runID)
	return event.Event{}
}

// reportEvent is the event that announces the run's report.
func (w *world) reportEvent(runID string) event.Event {
	w.t.Helper()
	for _, e := range w.eventsOf(runID) {
		if e.Type() == events.Type(events.ReportReady) {
			return e
		}
	}
	w.t.Fatalf("run %s has no %s event", runID, events.ReportReady)
	return event.Event{}
}

// checkedExample is the example spec with the data check asked for.
func checkedExample(t *testing.T) string {
	return strings.Replace(example(t), `"check": false`, `"check": true`, 1)
}

// TestDataCheckBeforeAnyWorker: a spec asking for the data check runs it on
// the head with the worker group at zero; the workers are asked for only
// once it passes, and its figures reach the record and the events.
func TestDataCheckBeforeAnyWorker(t *testing.T) {
	w := newWorld(t)
	runID := w.admit("jobs/checked.json", checkedExample(t))
	r := w.record(runID)
	if r.Phase != runs.Checking || r.Check == nil || r.Check.RayJob != names.RayJob(runID, 0) {
		t.Fatalf("phase %s, check %+v; want CHECKING with RayJob %s", r.Phase, r.Check, names.RayJob(runID, 0))
	}
	job, err := w.ray.RayV1().RayJobs("default").Get(w.ctx, names.RayJob(runID, 0), metav1.GetOptions{})
	if err != nil || !strings.HasPrefix(job.Spec.Entrypoint, "python /code/datacheck.py ") {
		t.Fatalf("check RayJob: %v %v", job, err)
	}
	if n := w.workers(); n != 0 || w.rayJobs() != 1 {
		t.Fatalf("%d workers asked for, %d RayJobs while checking; want 0 and 1", n, w.rayJobs())
	}
	w.setJob(runID, 0, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	w.tick()
	if r := w.record(runID); r.Phase != runs.Checking {
		t.Fatalf("phase %s before the check wrote a verdict", r.Phase)
	}
	w.put(output, "raydrop/"+runID+"/"+checkpoints.DataCheckFile, `{"ok": true,
		"dataset": {"source": "philschmid/amazon-product-descriptions-vlm", "split": "train", "revision": "", "resolvedRevision": "0123456789abcdef0123456789abcdef01234567"},
		"rows": {"total": 1345, "kept": 1340, "train": 1273, "eval": 67, "leftOut": 5},
		"leftOut": {"tooLong": 5}, "tokens": {"p50": 401, "p90": 460, "max": 1010, "maxSeqLength": 1024, "answer": 98000, "train": 520000, "eval": 27000},
		"images": {"total": 1345, "perRow": {"1": 1345}}, "steps": {"perEpoch": 20, "total": 60}, "estimate": {"seconds": 518.6, "gpuHours": 2.305, "usd": 23.05}, "seconds": 9.1}`)
	w.tick()
	r = w.record(runID)
	if r.Phase != runs.Submitted || r.Attempt != 1 || r.Check.EndedAt == nil || !r.Check.Result.OK || r.Check.Result.Steps.Total != 60 {
		t.Fatalf("after the check passed: phase %s attempt %d check %+v", r.Phase, r.Attempt, r.Check)
	}
	if n := w.workers(); n == 0 {
		t.Fatal("the workers were not asked for once the check passed")
	}
	// Training reads the very commit the check read.
	train, err := w.ray.RayV1().RayJobs("default").Get(w.ctx, names.RayJob(runID, 1), metav1.GetOptions{})
	if err != nil || !strings.Contains(train.Spec.Entrypoint, " --dataset-revision 0123456789abcdef0123456789abcdef01234567 ") {
		t.Errorf("training RayJob %v does not read the checked revision (%v)", train, err)
	}
	w.runToSuccess(runID, 1)
	if r := w.record(runID); r.Phase != runs.Succeeded {
		t.Fatalf("phase %s, reason %s: %s", r.Phase, r.Reason, r.Message)
	}
	if got, want := w.types(runID), []string{"accepted", "checking", "running", "succeeded", events.ReportReady}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	var final events.Run
	if err := w.terminalEvent(runID).DataAs(&final); err != nil || final.DataCheck == nil || final.DataCheck.Rows.LeftOut != 5 || final.DataCheck.Estimate.USD != 23.05 {
		t.Errorf("succeeded event's data check %+v (%v)", final.DataCheck, err)
	}
}

// TestBadDataFailsBeforeAnyWorker: a check that refuses the data ends the
// run FAILED InvalidData with its message, and no worker was ever asked for
// nor a training RayJob created.
func TestBadDataFailsBeforeAnyWorker(t *testing.T) {
	for _, c := range []struct {
		reason runs.Reason
		doc    string
	}{
		{runs.InvalidData, `{"ok": false, "reason": "InvalidData", "message": "gs://team-data/d/metadata.jsonl line 6 column 'image': image gs://team-data/d/images/05.png does not decode: cannot identify image file"}`},
		{runs.InvalidModel, `{"ok": false, "reason": "InvalidModel", "message": "model 'meta-llama/Llama-3-8B' is LlamaForCausalLM (model_type 'llama'); accepted: Gemma3ForConditionalGeneration"}`},
	} {
		t.Run(string(c.reason), func(t *testing.T) {
			w := newWorld(t)
			runID := w.admit("jobs/bad.json", checkedExample(t))
			w.setJob(runID, 0, rayv1.JobDeploymentStatusComplete, rayv1.JobStatusSucceeded)
			w.put(output, "raydrop/"+runID+"/"+checkpoints.DataCheckFile, c.doc)
			w.tick()
			r := w.record(runID)
			if r.Phase != runs.Failed || r.Reason != c.reason || !strings.Contains(r.Message, "the data check refused the run: ") || r.Check.Result == nil {
				t.Fatalf("phase %s reason %s message %q check %+v", r.Phase, r.Reason, r.Message, r.Check)
			}
			if len(r.Attempts) != 0 || w.rayJobs() != 1 || w.workers() != 0 {
				t.Errorf("%d attempts, %d RayJobs, %d workers; want none but the check", len(r.Attempts), w.rayJobs(), w.workers())
			}
			if got, want := w.types(runID), []string{"accepted", "checking", "failed", events.ReportReady}; !slices.Equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
			var final events.Run
			if err := w.terminalEvent(runID).DataAs(&final); err != nil || final.Reason != c.reason || final.DataCheck == nil || final.DataCheck.OK {
				t.Errorf("failed event %+v (%v)", final, err)
			}
		})
	}
}
