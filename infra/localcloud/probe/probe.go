// Package probe watches a running local cloud from outside, as a user and a
// downstream subscriber would: it uploads specs, reads run records, taps the
// public events topic and watches RayJobs and worker pods. The end-to-end
// suite, the proof suite and the benchmark share it.
package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Seen is one public event as a subscriber received it.
type Seen struct {
	events.Run
	ID  string    // the CloudEvent ID
	At  time.Time // when it arrived
	Raw []byte    // the message data as published
}

// Events collects the public events of the local cloud's events topic.
type Events struct {
	mu    sync.Mutex
	byRun map[string][]Seen // "" holds the events that did not decode
	wake  chan struct{}
}

// TapEvents subscribes to the events topic (subscription sub) and collects
// every event until ctx ends.
func TapEvents(ctx context.Context, st *stack.Stack, sub string) (*Events, error) {
	e := &Events{byRun: map[string][]Seen{}, wake: make(chan struct{}, 1)}
	err := st.PubSub.Tap(ctx, stack.Topics.Events, sub, func(_ context.Context, m *pubsubpb.PubsubMessage) bool {
		seen := Seen{At: time.Now(), Raw: m.Data}
		if ev, err := events.FromPubSub(m.Attributes, m.Data); err == nil {
			seen.ID = ev.ID()
			_ = json.Unmarshal(ev.Data(), &seen.Run)
		}
		e.mu.Lock()
		e.byRun[seen.RunID] = append(e.byRun[seen.RunID], seen)
		e.mu.Unlock()
		select {
		case e.wake <- struct{}{}:
		default:
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Of returns a run's events in arrival order.
func (e *Events) Of(runID string) []Seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.byRun[runID])
}

// OfSweep returns a sweep's own events (not its trials') in arrival
// order: their IDs are <sweep ID>/<phase>, and their data no run's.
func (e *Events) OfSweep(id string) []Seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Seen
	for _, s := range e.byRun[""] {
		if strings.HasPrefix(s.ID, id+"/") {
			out = append(out, s)
		}
	}
	return out
}

// Raw returns the data of every event received.
func (e *Events) Raw() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	var raw [][]byte
	for _, seen := range e.byRun {
		for _, s := range seen {
			raw = append(raw, s.Raw)
		}
	}
	return raw
}

// Runs returns the IDs of the runs with events.
func (e *Events) Runs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(maps.Keys(e.byRun))
}

// WaitTerminal waits up to limit for the run's terminal event, then settle
// longer (a duplicate would arrive by then), and returns the run's events.
func (e *Events) WaitTerminal(runID string, limit, settle time.Duration) ([]Seen, error) {
	return e.wait(runID, "terminal", Terminal, limit, settle)
}

// WaitReport waits up to limit for the event that announces the run's
// report (report_ready), which follows its terminal event, then settle
// longer, and returns the run's events.
func (e *Events) WaitReport(runID string, limit, settle time.Duration) ([]Seen, error) {
	return e.wait(runID, events.ReportReady, Report, limit, settle)
}

// wait waits up to limit until find finds an event of the run's, then
// settle longer, and returns the run's events.
func (e *Events) wait(runID, what string, find func([]Seen) *Seen, limit, settle time.Duration) ([]Seen, error) {
	deadline := time.Now().Add(limit)
	for {
		if find(e.Of(runID)) != nil {
			time.Sleep(settle)
			return e.Of(runID), nil
		}
		if !time.Now().Before(deadline) {
			break
		}
		select {
		case <-e.wake:
		case <-time.After(100 * time.Millisecond):
		}
	}
	return e.Of(runID), fmt.Errorf("no %s event for run %s within %s", what, runID, limit)
}

// WaitPublished waits, up to limit, until the subscriber has seen every
// event the run's record says was published. Pub/Sub delivers in no
// particular order, and the emulator redelivers a message whose stream it
// reset only after the subscription's ack deadline, so an event published
// a moment before the terminal one may arrive after it.
func (e *Events) WaitPublished(ctx context.Context, st *stack.Stack, runID string, limit time.Duration) ([]Seen, error) {
	deadline := time.Now().Add(limit)
	for {
		rec, err := Runs(st).Get(ctx, runID)
		if err != nil {
			return nil, err
		}
		seen := e.Of(runID)
		var missing []string
		for _, p := range rec.Published {
			if Count(seen, p.Event()) == 0 {
				missing = append(missing, p.Event())
			}
		}
		if len(missing) == 0 {
			return seen, nil
		}
		if !time.Now().Before(deadline) {
			return seen, fmt.Errorf("run %s: events %v recorded published, not received within %s", runID, missing, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Terminal is the first terminal event of evs, or nil.
func Terminal(evs []Seen) *Seen {
	for i := range evs {
		if events.Terminal[evs[i].Phase] {
			return &evs[i]
		}
	}
	return nil
}

// Report is the first event of evs that announces the run's report
// (report_ready), or nil.
func Report(evs []Seen) *Seen {
	for i := range evs {
		if evs[i].Phase == events.ReportReady {
			return &evs[i]
		}
	}
	return nil
}

// Count counts the events of a phase; "terminal" counts every terminal one.
func Count(evs []Seen, phase string) int {
	n := 0
	for _, e := range evs {
		if e.Phase == phase || phase == "terminal" && events.Terminal[e.Phase] {
			n++
		}
	}
	return n
}

// Upload writes jobs/<name>.json to the intake bucket with a scenario for
// its simulated Ray job (see stack.SimMetadata) and returns the run ID.
func Upload(ctx context.Context, st *stack.Stack, name string, data []byte, scenario string) (string, error) {
	id, _, err := UploadObject(ctx, st, name, data, scenario)
	return id, err
}

// UploadObject is Upload that returns the object's generation too, for a
// test that delivers its notification again (Notification).
func UploadObject(ctx context.Context, st *stack.Stack, name string, data []byte, scenario string) (string, int64, error) {
	object := "jobs/" + name + ".json"
	w := st.GCS.Bucket(stack.IntakeBucket).Object(object).NewWriter(ctx)
	w.Metadata = map[string]string{stack.SimMetadata: scenario}
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return "", 0, err
	}
	if err := w.Close(); err != nil {
		return "", 0, err
	}
	gen := w.Attrs().Generation
	return names.RunIDFromObject(stack.IntakeBucket, object, gen), gen, nil
}

// RunIDOfObject is the run ID of jobs/<name>.json at generation gen.
func RunIDOfObject(name string, gen int64) string {
	return names.RunIDFromObject(stack.IntakeBucket, "jobs/"+name+".json", gen)
}

// Notification is the Cloud Storage notification of an intake object's
// finalize, as fake-gcs-server publishes it: publishing it again is a
// duplicate delivery of the upload's event.
func Notification(object string, gen int64, size int) *pubsub.Message {
	data, _ := json.Marshal(map[string]string{"kind": "storage#object", "bucket": stack.IntakeBucket, "name": object, "generation": fmt.Sprint(gen), "size": fmt.Sprint(size)})
	return &pubsub.Message{Data: data, Attributes: map[string]string{
		"eventType": "OBJECT_FINALIZE", "bucketId": stack.IntakeBucket, "objectId": object,
		"objectGeneration": fmt.Sprint(gen), "payloadFormat": "JSON_API_V1",
	}}
}

// Spec is example (a job spec's JSON) on its own cluster, writing to bucket,
// with the data check off (the suites drive the phases after it; a test of
// the check gives a dataset that asks for it) and the given top-level
// overrides merged in.
func Spec(example []byte, cluster, bucket string, extra map[string]any) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(example, &m); err != nil {
		return nil, err
	}
	m["cluster"].(map[string]any)["name"] = cluster
	m["output"].(map[string]any)["bucket"] = bucket
	m["dataset"] = map[string]any{"check": false}
	maps.Copy(m, extra)
	return json.Marshal(m)
}

// Runs reads run records of the local cloud.
func Runs(st *stack.Stack) *runs.Store {
	return &runs.Store{Bucket: st.GCS.Bucket(stack.StateBucket)}
}

// WaitPhase polls the run record until it reaches one of want.
func WaitPhase(ctx context.Context, st *stack.Stack, runID string, limit time.Duration, want ...runs.Phase) (*runs.Record, error) {
	return waitRecord(ctx, st, runID, limit, func(r *runs.Record) bool { return slices.Contains(want, r.Phase) },
		func(r *runs.Record) string { return fmt.Sprintf("is %s (%s), want %v", r.Phase, r.Reason, want) })
}

// WaitAnnounced polls the run record until the run has ended and every
// announcement is out: its terminal event, then its report's (or the report
// is known not to be written).
func WaitAnnounced(ctx context.Context, st *stack.Stack, runID string, limit time.Duration) (*runs.Record, error) {
	return waitRecord(ctx, st, runID, limit, func(r *runs.Record) bool { return r.Phase.Terminal() && !r.Unannounced() },
		func(r *runs.Record) string {
			return fmt.Sprintf("is %s, published %v: not announced", r.Phase, r.Published)
		})
}

// waitRecord polls the run record until done says it is done; on a miss,
// the error says what the last record read was (missing).
func waitRecord(ctx context.Context, st *stack.Stack, runID string, limit time.Duration, done func(*runs.Record) bool, missing func(*runs.Record) string) (*runs.Record, error) {
	store := Runs(st)
	deadline := time.Now().Add(limit)
	var last *runs.Record
	for time.Now().Before(deadline) {
		r, err := store.Get(ctx, runID)
		switch {
		case err == nil:
			last = r
			if done(r) {
				return r, nil
			}
		case !errors.Is(err, runs.ErrNotFound):
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last != nil {
		return last, fmt.Errorf("run %s after %s: %s", runID, limit, missing(last))
	}
	return nil, fmt.Errorf("run %s has no record after %s", runID, limit)
}

// Ended are the terminal phases.
var Ended = []runs.Phase{runs.Succeeded, runs.Failed, runs.Cancelled, runs.Rejected, runs.Stopped}

// Workers counts a cluster's worker pods.
func Workers(ctx context.Context, kube kubernetes.Interface, cluster string) (int, error) {
	pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/node-type=worker,ray.io/cluster=" + cluster})
	if err != nil {
		return 0, err
	}
	return len(pods.Items), nil
}

// WaitNoWorkers waits until the cluster has no worker pod.
func WaitNoWorkers(ctx context.Context, kube kubernetes.Interface, cluster string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n, err := Workers(ctx, kube, cluster)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d worker pods of %s still exist after %s", n, cluster, limit)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// RayJobs records every RayJob creation the API server announces, by run.
type RayJobs struct {
	mu      sync.Mutex
	created map[string][]Created
}

// Created is one RayJob seen created.
type Created struct {
	Name       string
	UID        string
	Entrypoint string
	At         time.Time // when the watch announced it
}

// WatchRayJobs watches RayJobs in every namespace until ctx ends.
func WatchRayJobs(ctx context.Context, ray rayclient.Interface) (*RayJobs, error) {
	w := &RayJobs{created: map[string][]Created{}}
	lw := cache.NewListWatchFromClient(ray.RayV1().RESTClient(), "rayjobs", metav1.NamespaceAll, fields.Everything())
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &rayv1.RayJob{},
		Handler: cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
			j, ok := obj.(*rayv1.RayJob)
			if !ok {
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			run := j.Labels[names.LabelRunID]
			for _, c := range w.created[run] {
				if c.UID == string(j.UID) {
					return // a relist
				}
			}
			w.created[run] = append(w.created[run], Created{Name: j.Name, UID: string(j.UID), Entrypoint: j.Spec.Entrypoint, At: time.Now()})
		}},
	})
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, errors.New("rayjob watch did not sync")
	}
	return w, nil
}

// All returns every RayJob seen created.
func (w *RayJobs) All() []Created {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Created
	for _, c := range w.created {
		out = append(out, c...)
	}
	return out
}

// Of returns the RayJobs created for a run.
func (w *RayJobs) Of(runID string) []Created {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.created[runID])
}
