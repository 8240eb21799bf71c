package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	"google.golang.org/api/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/functions"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// multiKueue is the RayJob managedBy value that makes KubeRay's operator
// leave a RayJob alone (another controller, MultiKueue, runs it).
const multiKueue = "kueue.x-k8s.io/multikueue"

// sweep measures the Monitor's sweep over n active runs. The runs live in a
// bucket of their own, each RUNNING with its record and its RayJob, both
// as the pipeline writes them; the RayJobs carry managedBy: MultiKueue so
// the local cloud's KubeRay leaves them (and their status, set to RUNNING)
// alone, as no cluster stands behind them. The sweep itself is the
// Monitor's own code with the production clients, through counting
// transports.
func (b *bench) sweep(n int) error {
	ctx := b.ctx
	const bucket = "raydrop-sweep-bench"
	if err := b.st.GCS.Bucket(bucket).Create(ctx, stack.Project, nil); err != nil {
		return err
	}
	door, err := b.st.GCSProxy.Door("sweep-bench")
	if err != nil {
		return err
	}
	gcs, err := storage.NewClient(ctx, option.WithEndpoint("http://"+door+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		return err
	}
	defer func() { _ = gcs.Close() }()
	var kubeReqs atomic.Int64
	cfg := rest.CopyConfig(b.st.Sim.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			kubeReqs.Add(1)
			return rt.RoundTrip(r)
		})
	}
	ray, err := rayclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return err
	}
	conf, err := config.Parse(config.Config{Project: stack.Project, IntakeBucket: bucket, Kubeconfig: b.st.Kubeconfig, OutputBuckets: []string{"unused"}}.Env())
	if err != nil {
		return err
	}
	// The monitor as deployed: its dependencies from pipeline.Assemble and
	// its handler from the functions' table, sent the scheduler's tick.
	// The sweep logs what it could not do and goes on (the next tick tries
	// again): every warning it logs fails the section.
	logs := &warnings{}
	deps := pipeline.Assemble(conf, pipeline.Clients{
		GCS: gcs, Publisher: &gcp.PubSub{Client: b.st.PS}, Ray: ray, Kube: kube, Log: slog.New(logs),
	})
	store := deps.Runs.(*runs.Store)
	monitor := functions.Handlers["monitor"](deps)
	tick := tickEvent(conf.Topics.Ticks)
	data, err := probe.Spec(b.spec, "sweep", output, nil)
	if err != nil {
		return err
	}
	base, err := spec.Parse(data)
	if err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "bench: seeding %d RUNNING runs (records and RayJobs)\n", n)
	t0 := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := seedRun(b, ray, store, base, i); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench: seeded in %.1f s\n", time.Since(t0).Seconds())

	var times []float64
	var kubeCounts, gcsCounts []float64
	for range 3 {
		kubeReqs.Store(0)
		b.st.GCSProxy.Reset()
		t := time.Now()
		if err := monitor.Handle(ctx, tick); err != nil {
			return err
		}
		if w := logs.take(); len(w) > 0 {
			return fmt.Errorf("the sweep logged %d warnings, the first: %s", len(w), w[0])
		}
		times = append(times, time.Since(t).Seconds())
		kubeCounts = append(kubeCounts, float64(kubeReqs.Load()))
		ops := 0
		for _, r := range b.st.GCSProxy.Requests() {
			if r.Client == "sweep-bench" {
				ops++
			}
		}
		gcsCounts = append(gcsCounts, float64(ops))
	}
	note := fmt.Sprintf("%d RUNNING runs; median of 3 sweeps (%s s, %s s, %s s)", n, trim(times[0]), trim(times[1]), trim(times[2]))
	b.add("sweep", "sweep time", median(times), "s", 2, note)
	// One LIST per kind of object, however many runs: RayJobs, RayClusters,
	// worker pods, and the events that say a node was lost.
	b.add("sweep", "Kubernetes requests per sweep", median(kubeCounts), "requests", 4, note)
	b.add("sweep", "Cloud Storage operations per sweep", median(gcsCounts), "ops", -1, note)

	// Leave nothing behind for the sections after.
	_ = ray.RayV1().RayJobs("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "raydrop.dev/bench=sweep"})
	return nil
}

// seedRun writes run i: its RayJob (RUNNING) and its record (RUNNING,
// running already announced).
func seedRun(b *bench, ray rayclient.Interface, store *runs.Store, base *spec.JobSpec, i int) error {
	ctx := b.ctx
	s := *base
	s.Cluster.Name = fmt.Sprintf("sweep-%04d", i)
	runID := fmt.Sprintf("sweep-%04d", i)
	job := manifests.RayJob(&s, manifests.Run{ID: runID, Attempt: 1, Source: "bench"})
	managedBy := multiKueue
	job.Spec.ManagedBy = &managedBy
	job.Labels["raydrop.dev/bench"] = "sweep"
	created, err := ray.RayV1().RayJobs(s.Cluster.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusRunning
	created.Status.JobStatus = rayv1.JobStatusRunning
	if _, err := ray.RayV1().RayJobs(s.Cluster.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	now := time.Now().UTC()
	rec := runs.NewRecord(runID, "bench", "sweep", &s, nil, now)
	rec.Published = []runs.Phase{runs.Accepted, runs.Running}
	for _, mark := range []func() error{
		func() error { return rec.MarkProvisioned(runs.Attempt{N: 1, RayJob: job.Name}, "", now) },
		func() error { return rec.MarkSubmitted(1, now) },
		func() error { return rec.MarkRunning(1, now) },
	} {
		if err := mark(); err != nil {
			return err
		}
	}
	return store.Create(ctx, rec)
}

// tickEvent is the scheduler's tick as Eventarc delivers it: a Pub/Sub
// message published on the ticks topic.
func tickEvent(topic string) event.Event {
	e := event.New()
	e.SetID("bench-tick")
	e.SetType(pipeline.PubSubPublished)
	e.SetSource("//pubsub.googleapis.com/projects/" + stack.Project + "/topics/" + topic)
	data, _ := json.Marshal(map[string]any{"message": map[string]any{"data": []byte("{}"), "messageId": "bench-tick"}, "subscription": "projects/" + stack.Project + "/subscriptions/bench"})
	_ = e.SetData(event.ApplicationJSON, data)
	return e
}

// warnings is a log handler that keeps the messages of warnings and errors.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		msg += " " + a.String()
		return true
	})
	w.mu.Lock()
	w.msgs = append(w.msgs, msg)
	w.mu.Unlock()
	return nil
}

// take returns the messages kept since the last take.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}
