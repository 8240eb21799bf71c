// Package pipelinetest builds the functions' dependencies for the table
// tests beside each handler: the real run and lease stores over an
// in-process Cloud Storage (pkg/gcstest), KubeRay's and Kubernetes'
// generated fake clientsets, a publisher that records every message, a
// clock the test sets, and errors injected into the run store or the
// publisher. Tests put the world in the state they start from (records,
// leases, cluster objects), deliver one event to one handler, and read the
// writes it made.
package pipelinetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"
	rayfake "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/gcstest"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// The world's buckets.
const (
	Intake = "raydrop-intake"
	State  = "raydrop-state"
	Output = "my-project-raydrop-checkpoints"
	Data   = "team-data"
)

// T0 is the time every world starts at.
var T0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// World is the functions' dependencies over in-memory fakes.
type World struct {
	T    testing.TB
	Ctx  context.Context
	Now  time.Time
	Deps *pipeline.Deps
	GCS  *storage.Client
	Ray  *rayfake.Clientset
	Kube *kubefake.Clientset
	// Runs is the run store the handlers use, with errors to inject.
	Runs *Faulty

	mu   sync.Mutex
	sent []Message
	// publishFails: the next publishes to a topic fail with this error.
	publishFails map[string][]error
	seq          int
}

// Message is a message a handler published.
type Message struct {
	Topic string
	Data  []byte
	Attrs map[string]string
}

// Step decodes a step message.
func (m Message) Step() pipeline.Step {
	var s pipeline.Step
	_ = json.Unmarshal(m.Data, &s)
	return s
}

// New is a world at T0 with no run, lease or cluster.
func New(t testing.TB) *World {
	t.Helper()
	// The stores' pacing of writes to one object (Cloud Storage's rate
	// of about one a second) only slows a table down.
	gcsdoc.WriteInterval = 0
	w := &World{T: t, Ctx: context.Background(), Now: T0, GCS: gcstest.New(t, Intake, State, Output, Data),
		Ray: rayfake.NewSimpleClientset(), Kube: kubefake.NewClientset(), publishFails: map[string][]error{}}
	cfg, err := config.Parse([]string{
		config.EnvProject + "=p", config.EnvIntakeBucket + "=" + Intake, config.EnvStateBucket + "=" + State,
		config.EnvKubeconfig + "=unused", config.EnvOutputBuckets + "=" + Output, config.EnvDataBuckets + "=" + Data,
	})
	if err != nil {
		t.Fatal(err)
	}
	clock := runs.Clock(func() time.Time { return w.Now })
	out := io.Discard
	if testing.Verbose() {
		out = os.Stderr
	}
	w.Deps = pipeline.Assemble(cfg, pipeline.Clients{
		GCS: w.GCS, Publisher: w, Ray: w.Ray, Kube: w.Kube.CoreV1(),
		Log: slog.New(slog.NewTextHandler(out, nil)), Clock: clock,
	})
	w.Runs = &Faulty{Runs: w.Deps.Runs}
	w.Deps.Runs = w.Runs
	return w
}

// Publish records a message (the handlers' Publisher), or fails as
// FailPublish asked.
func (w *World) Publish(_ context.Context, topic string, data []byte, attrs map[string]string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if errs := w.publishFails[topic]; len(errs) > 0 {
		w.publishFails[topic] = errs[1:]
		if errs[0] != nil {
			return errs[0]
		}
	}
	w.sent = append(w.sent, Message{Topic: topic, Data: data, Attrs: attrs})
	return nil
}

// FailPublish makes the next publish to topic fail with err.
func (w *World) FailPublish(topic string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishFails[topic] = append(w.publishFails[topic], err)
}

// FailPublishAfter lets the next n publishes to topic through, then fails
// one with err.
func (w *World) FailPublishAfter(topic string, n int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishFails[topic] = append(w.publishFails[topic], append(make([]error, n), err)...)
}

// Reset forgets the messages published so far.
func (w *World) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = nil
}

// Sent lists the messages published to topic, in order.
func (w *World) Sent(topic string) []Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Message
	for _, m := range w.sent {
		if m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// Steps lists the steps sent to topic, as "runId/attempt" strings.
func (w *World) Steps(topic string) []string {
	var out []string
	for _, m := range w.Sent(topic) {
		s := m.Step()
		out = append(out, fmt.Sprintf("%s/%d", s.RunID, s.Attempt))
	}
	return out
}

// Events lists the public events published, as "runId:phase" strings in
// the order they went out.
func (w *World) Events() []string {
	var out []string
	for _, m := range w.Sent(w.Deps.Config.Topics.Events) {
		out = append(out, strings.TrimPrefix(m.Attrs["ce-subject"], "runs/")+":"+strings.TrimPrefix(m.Attrs["ce-type"], "dev.raydrop.run.v1."))
	}
	return out
}

// Spec parses examples/gemma3-vision.json with the data check off (most
// tests drive the phases after it; a test of the check sets dataset.check),
// with edit applied to its JSON object first, when not nil: a valid spec
// whose checkpoints go to Output.
func (w *World) Spec(edit func(map[string]any)) *spec.JobSpec {
	w.T.Helper()
	s, err := spec.Parse(w.SpecJSON(edit))
	if err != nil {
		w.T.Fatal(err)
	}
	return s
}

// SpecJSON is Spec's JSON.
func (w *World) SpecJSON(edit func(map[string]any)) []byte {
	w.T.Helper()
	b, err := os.ReadFile(exampleSpec())
	if err != nil {
		w.T.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		w.T.Fatal(err)
	}
	m["dataset"] = map[string]any{"check": false}
	if edit != nil {
		edit(m)
	}
	b, _ = json.Marshal(m)
	return b
}

// exampleSpec finds examples/gemma3-vision.json from the test's folder.
func exampleSpec() string {
	p := "examples/gemma3-vision.json"
	for i := 0; i < 5; i++ {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		p = "../" + p
	}
	return "examples/gemma3-vision.json"
}

// Put creates a record as the world's state before the event.
func (w *World) Put(r *runs.Record) {
	w.T.Helper()
	if err := w.Runs.Runs.Create(w.Ctx, r); err != nil {
		w.T.Fatal(err)
	}
}

// Record reads a run's record.
func (w *World) Record(runID string) *runs.Record {
	w.T.Helper()
	r, err := w.Runs.Runs.Get(w.Ctx, runID)
	if err != nil {
		w.T.Fatal(err)
	}
	return r
}

// Write puts an object into a bucket.
func (w *World) Write(bucket, name, body string) {
	w.T.Helper()
	wr := w.GCS.Bucket(bucket).Object(name).NewWriter(w.Ctx)
	_, _ = io.WriteString(wr, body)
	if err := wr.Close(); err != nil {
		w.T.Fatal(err)
	}
}

// StepEvent is the Pub/Sub delivery of a step message on topic.
func (w *World) StepEvent(topic string, s pipeline.Step) event.Event {
	b, _ := json.Marshal(s)
	return w.MessageEvent(topic, b, map[string]string{"runId": s.RunID})
}

// MessageEvent is the Pub/Sub delivery of a message on topic.
func (w *World) MessageEvent(topic string, data []byte, attrs map[string]string) event.Event {
	w.seq++
	return PubSubEvent(fmt.Sprint(w.seq), topic, data, attrs)
}

// PubSubEvent is the Eventarc delivery of Pub/Sub message id on topic
// (google.cloud.pubsub.topic.v1.messagePublished).
func PubSubEvent(id, topic string, data []byte, attrs map[string]string) event.Event {
	e := event.New()
	e.SetID(id)
	e.SetType(pipeline.PubSubPublished)
	e.SetSource("//pubsub.googleapis.com/projects/p/topics/" + topic)
	b, _ := json.Marshal(map[string]any{"message": map[string]any{"data": data, "attributes": attrs, "messageId": id}, "subscription": "projects/p/subscriptions/" + topic})
	_ = e.SetData("application/json", b)
	return e
}

// Upload writes an object to the intake bucket and returns its finalized
// event.
func (w *World) Upload(name, body string) event.Event {
	w.T.Helper()
	return Upload(w.T, w.GCS, Intake, name, body)
}

// Upload writes an object to bucket and returns its finalized event
// (google.cloud.storage.object.v1.finalized).
func Upload(t testing.TB, gcs *storage.Client, bucket, name, body string) event.Event {
	t.Helper()
	wr := gcs.Bucket(bucket).Object(name).NewWriter(context.Background())
	_, _ = io.WriteString(wr, body)
	if err := wr.Close(); err != nil {
		t.Fatal(err)
	}
	a := wr.Attrs()
	e := event.New()
	e.SetID(fmt.Sprintf("gcs-%d", a.Generation))
	e.SetType(pipeline.StorageFinalized)
	e.SetSource("//storage.googleapis.com/projects/_/buckets/" + bucket)
	e.SetSubject("objects/" + name)
	b, _ := json.Marshal(map[string]any{"bucket": bucket, "name": name, "generation": fmt.Sprint(a.Generation), "size": a.Size})
	_ = e.SetData("application/json", b)
	return e
}

// ErrKind is how the platform takes a handler's answer: "" (acknowledged),
// "permanent" (acknowledged, logged as dropped) or "transient"
// (redelivered).
func ErrKind(err error) string {
	switch {
	case err == nil:
		return ""
	case pipeline.IsPermanent(err):
		return "permanent"
	}
	return "transient"
}

// Workers is the worker replicas of the world's RayCluster (or its
// minReplicas, which KubeRay clamps replicas up to), -1 without one.
func (w *World) Workers() int32 {
	w.T.Helper()
	l, err := w.Ray.RayV1().RayClusters("default").List(w.Ctx, metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	if len(l.Items) == 0 {
		return -1
	}
	var n int32
	for _, g := range l.Items[0].Spec.WorkerGroupSpecs {
		n += max(*g.Replicas, *g.MinReplicas)
	}
	return n
}

// Faulty is a run store whose calls fail where a test asks.
type Faulty struct {
	Runs pipeline.Runs
	mu   sync.Mutex
	// fails holds, per operation ("create", "get", "update", "list"),
	// the errors the next calls return.
	fails map[string][]error
}

// Fail makes the next call of op ("create", "get", "update", "list") fail
// with err, without reaching the store.
func (f *Faulty) Fail(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails == nil {
		f.fails = map[string][]error{}
	}
	f.fails[op] = append(f.fails[op], err)
}

func (f *Faulty) fail(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if errs := f.fails[op]; len(errs) > 0 {
		f.fails[op] = errs[1:]
		return errs[0]
	}
	return nil
}

// Create implements pipeline.Runs.
func (f *Faulty) Create(ctx context.Context, r *runs.Record) error {
	if err := f.fail("create"); err != nil {
		return err
	}
	return f.Runs.Create(ctx, r)
}

// Get implements pipeline.Runs.
func (f *Faulty) Get(ctx context.Context, runID string) (*runs.Record, error) {
	if err := f.fail("get"); err != nil {
		return nil, err
	}
	return f.Runs.Get(ctx, runID)
}

// Update implements pipeline.Runs.
func (f *Faulty) Update(ctx context.Context, runID string, fn func(*runs.Record) error) (*runs.Record, error) {
	if err := f.fail("update"); err != nil {
		return nil, err
	}
	return f.Runs.Update(ctx, runID, fn)
}

// List implements pipeline.Runs.
func (f *Faulty) List(ctx context.Context) ([]runs.Summary, error) {
	if err := f.fail("list"); err != nil {
		return nil, err
	}
	return f.Runs.List(ctx)
}

// ErrUnavailable is a transient error to inject: what an API answers while
// it is down.
var ErrUnavailable = errors.New("503 service unavailable")

// NewRun puts a run of spec s into the world at phase to (ACCEPTED,
// QUEUED, PROVISIONED, SUBMITTED, RUNNING or FINISHING), as the pipeline
// would have left it: its cluster leased to it (queued behind another run
// for QUEUED), every
// event of the phases it went through published, its attempt 1 begun (a
// run past PROVISIONED), and for FINISHING the ending given. It returns the
// record as stored.
func (w *World) NewRun(runID string, s *spec.JobSpec, to runs.Phase, end runs.Ending) *runs.Record {
	w.T.Helper()
	r := runs.NewRecord(runID, "test", s.Name, s, nil, w.Now)
	if to == runs.Queued {
		// Behind another run that holds the cluster.
		if _, err := w.Deps.Leases.Acquire(w.Ctx, r.Namespace, r.Cluster, "other-run"); err != nil {
			w.T.Fatal(err)
		}
		if err := r.MarkQueued("other-run", w.Now); err != nil {
			w.T.Fatal(err)
		}
	}
	if _, err := w.Deps.Leases.Acquire(w.Ctx, r.Namespace, r.Cluster, runID); err != nil {
		w.T.Fatal(err)
	}
	steps := []struct {
		phase runs.Phase
		mark  func() error
	}{
		{runs.Provisioned, func() error {
			return r.MarkProvisioned(runs.Attempt{N: 1, RayJob: names.RayJob(runID, 1)}, "", w.Now)
		}},
		{runs.Submitted, func() error { return r.MarkSubmitted(1, w.Now) }},
		{runs.Running, func() error { return r.MarkRunning(1, w.Now) }},
		{runs.Finishing, func() error { return r.MarkFinishing(1, end, w.Now) }},
	}
	for _, st := range steps {
		if r.Phase == to || to == runs.Accepted || to == runs.Queued {
			break
		}
		if err := st.mark(); err != nil {
			w.T.Fatal(err)
		}
	}
	for _, e := range r.History {
		if e.Phase.Event() != "" {
			r.MarkPublished(e.Phase)
		}
	}
	w.Put(r)
	return w.Record(runID)
}

// WriteLayout writes what the trainer writes for an attempt of the run
// under the spec's storage path: one checkpoint per epoch, result.json,
// and the completion mark of status ("": none).
func (w *World) WriteLayout(r *runs.Record, attempt, epochs int, status string) {
	w.T.Helper()
	bucket, exp := manifests.Experiment(r.Spec, r.RunID, attempt)
	trial := exp + "/TorchTrainer_abcde_00000_0_2026-11-30_10-00-00"
	var lines []string
	for e := range epochs {
		ck := fmt.Sprintf("checkpoint_%06d", e)
		for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
			w.Write(bucket, trial+"/"+ck+"/checkpoint/"+f, "x")
		}
		lines = append(lines, fmt.Sprintf(`{"step": %d, "epoch": %d, "loss": %g, "checkpoint_dir_name": %q}`, (e+1)*10, e+1, 2.0-float64(e)*0.5, ck))
	}
	w.Write(bucket, trial+"/result.json", strings.Join(lines, "\n")+"\n")
	if status != "" {
		errText := "null"
		if status == "failed" {
			errText = `"ValueError: bad data"`
		}
		w.Write(bucket, exp+"/"+checkpoints.MarkFile, fmt.Sprintf(`{"status": %q, "error": %s, "finalMetrics": {"train_loss": 1.1, "train_runtime": 30}}`, status, errText))
	}
}

// Bring brings the run's RayCluster (and trainer ConfigMap) up with its
// workers, as Provision left it.
func (w *World) Bring(r *runs.Record) {
	w.T.Helper()
	if _, err := w.Deps.Prepare(w.Ctx, r, 1, "", ""); err != nil {
		w.T.Fatal(err)
	}
}
