package subscriber

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/gcstest"
	"github.com/raydrop/raydrop/pkg/logging"
)

const (
	checkpointBucket = "raydrop-checkpoints"
	modelBucket      = "team-models"
	runName          = "gemma3-vision"
	folder           = "models/" + runName + "/latest/"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// checkpointFiles is what the trainer writes into every checkpoint: the
// adapter, what resuming needs, and the processor files.
var checkpointFiles = append(slices.Clone(checkpoints.AdapterFiles),
	"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
	"tokenizer.json", "tokenizer_config.json", "processor_config.json")

// world is a checkpoint bucket, a destination bucket and the handler.
type world struct {
	t    *testing.T
	ctx  context.Context
	gcs  *storage.Client
	h    *Handler
	logs *bytes.Buffer
}

// newWorld runs over gcs, which holds checkpointBucket and modelBucket
// unless the test says otherwise.
func newWorld(t *testing.T, gcs *storage.Client) *world {
	t.Helper()
	var logs bytes.Buffer
	return &world{
		t: t, ctx: context.Background(), gcs: gcs, logs: &logs,
		h: &Handler{Storage: gcs, Bucket: modelBucket, Prefix: DefaultPrefix, Log: logging.New(&logs, slog.LevelDebug)},
	}
}

func newFakeWorld(t *testing.T) *world {
	return newWorld(t, gcstest.New(t, checkpointBucket, modelBucket))
}

// content is what a checkpoint file of a run holds in these tests.
func content(runID string, step int64, file string) []byte {
	return fmt.Appendf(nil, "%s of run %s at step %d", file, runID, step)
}

// checkpoint writes one checkpoint of a run as Ray Train leaves it, except
// the files named in missing, and returns it as events name it.
func (w *world) checkpoint(runID string, step int64, evalLoss float64, missing ...string) checkpoints.Checkpoint {
	w.t.Helper()
	name := fmt.Sprintf("checkpoint_%06d", step/10)
	dir := "runs/" + runID + "/TorchTrainer_1a2b3_00000_0_2026-11-30_10-00-00/" + name + "/checkpoint"
	for _, f := range checkpointFiles {
		if !slices.Contains(missing, f) {
			w.put(checkpointBucket, dir+"/"+f, content(runID, step, f))
		}
	}
	return checkpoints.Checkpoint{
		Name: name, URI: "gs://" + checkpointBucket + "/" + dir, Step: step, Epoch: float64(step) / 20,
		Metrics: map[string]float64{"eval_loss": evalLoss, "loss": evalLoss + 0.1, "step": float64(step)}, Complete: true,
	}
}

func (w *world) put(bucket, name string, b []byte) {
	w.t.Helper()
	ow := w.gcs.Bucket(bucket).Object(name).NewWriter(w.ctx)
	ow.ContentType = "application/octet-stream"
	if _, err := ow.Write(b); err != nil {
		w.t.Fatal(err)
	}
	if err := ow.Close(); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) read(bucket, name string) []byte {
	w.t.Helper()
	r, err := w.gcs.Bucket(bucket).Object(name).NewReader(w.ctx)
	if err != nil {
		w.t.Fatalf("read gs://%s/%s: %v", bucket, name, err)
	}
	defer func() { _ = r.Close() }()
	b, err := io.ReadAll(r)
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// objects lists the destination bucket: every object's attributes by name.
func (w *world) objects() map[string]*storage.ObjectAttrs {
	w.t.Helper()
	out := map[string]*storage.ObjectAttrs{}
	it := w.gcs.Bucket(modelBucket).Objects(w.ctx, nil)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out
		}
		if err != nil {
			w.t.Fatal(err)
		}
		out[a.Name] = a
	}
}

// generations is the destination bucket as object generations by name: a
// rewritten object has a new one.
func (w *world) generations() map[string]int64 {
	out := map[string]int64{}
	for n, a := range w.objects() {
		out[n] = a.Generation
	}
	return out
}

func (w *world) manifest() Manifest {
	w.t.Helper()
	var m Manifest
	if err := json.Unmarshal(w.read(modelBucket, folder+ManifestFile), &m); err != nil {
		w.t.Fatal(err)
	}
	return m
}

// logged returns the log lines with the given message.
func (w *world) logged(message string) []map[string]any {
	w.t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(w.logs.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var line map[string]any
		if err := json.Unmarshal(l, &line); err != nil {
			w.t.Fatalf("log line %s: %v", l, err)
		}
		if line["message"] == message {
			out = append(out, line)
		}
	}
	return out
}

// succeeded is the data of a run's succeeded event with best as its best
// checkpoint (and latest, unless latest is given).
func succeeded(runID string, ended time.Time, best checkpoints.Checkpoint, latest ...checkpoints.Checkpoint) events.Run {
	l := best
	if len(latest) > 0 {
		l = latest[0]
	}
	started := ended.Add(-time.Hour)
	return events.Run{
		RunID: runID, Name: runName, Source: "gs://raydrop-intake/jobs/" + runID + ".json#1", Phase: "succeeded",
		Attempt: 1, Checkpoints: []checkpoints.Checkpoint{best, l}, LatestCheckpoint: &l, BestCheckpoint: &best,
		BestBy: "eval_loss", FinalMetrics: map[string]float64{"loss": 0.42, "eval_loss": 0.51},
		StartedAt: &started, EndedAt: &ended,
	}
}

// raydropEvent is the CloudEvent raydrop publishes for data.
func raydropEvent(t *testing.T, data events.Run) event.Event {
	t.Helper()
	at := t0
	if data.EndedAt != nil {
		at = *data.EndedAt
	}
	e, err := events.New("//raydrop.dev/raydrop", data, at)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var messageIDs atomic.Int64

// published is e as an Eventarc Pub/Sub trigger delivers it: the message
// raydrop published (events.PubSubAttributes, the JSON data) in a
// messagePublished event.
func published(t *testing.T, e event.Event) event.Event {
	t.Helper()
	return envelope(t, events.PubSubAttributes(e), e.Data())
}

// envelope is a messagePublished event of a message with attrs and data.
func envelope(t *testing.T, attrs map[string]string, data []byte) event.Event {
	t.Helper()
	id := fmt.Sprint(17000000000 + messageIDs.Add(1))
	msg := map[string]any{
		"message": map[string]any{
			"attributes": attrs, "data": data, "messageId": id, "publishTime": t0.Format(time.RFC3339Nano),
		},
		"subscription": "projects/team/subscriptions/eventarc-us-central1-promote-adapter-sub-123",
	}
	e := event.New()
	e.SetID(id)
	e.SetType(PubSubPublished)
	e.SetSource("//pubsub.googleapis.com/projects/raydrop/topics/raydrop-events")
	e.SetTime(t0)
	if err := e.SetData(event.ApplicationJSON, msg); err != nil {
		t.Fatal(err)
	}
	return e
}

func (w *world) deliver(e event.Event) {
	w.t.Helper()
	if err := w.h.Handle(w.ctx, e); err != nil {
		w.t.Fatalf("Handle(%s %s) = %v, want nil\nlogs:\n%s", e.Type(), e.ID(), err, w.logs)
	}
}

// assertLatest checks that latest/ holds exactly the adapter of ck, of run
// runID, and its manifest.
func (w *world) assertLatest(runID string, ck checkpoints.Checkpoint) {
	w.t.Helper()
	objs := w.objects()
	want := []string{folder + ManifestFile}
	for _, f := range checkpoints.AdapterFiles {
		want = append(want, folder+f)
	}
	slices.Sort(want)
	if got := slices.Sorted(maps.Keys(objs)); !slices.Equal(got, want) {
		w.t.Fatalf("destination holds %v, want %v", got, want)
	}
	for _, f := range checkpoints.AdapterFiles {
		if got, want := w.read(modelBucket, folder+f), content(runID, ck.Step, f); !bytes.Equal(got, want) {
			w.t.Errorf("%s holds %q, want %q", f, got, want)
		}
		if got := objs[folder+f].Metadata[MetaRunID]; got != runID {
			w.t.Errorf("%s has %s %q, want %q", f, MetaRunID, got, runID)
		}
	}
	m := w.manifest()
	if m.RunID != runID || m.CheckpointURI != ck.URI || m.Step != ck.Step {
		w.t.Errorf("manifest names run %s checkpoint %s step %d, want %s %s %d", m.RunID, m.CheckpointURI, m.Step, runID, ck.URI, ck.Step)
	}
	if got := objs[folder+ManifestFile].Metadata[MetaRunID]; got != runID {
		w.t.Errorf("manifest has %s %q, want %q", MetaRunID, got, runID)
	}
	for _, f := range m.Files {
		if a := objs[folder+f.Name]; a == nil || a.Generation != f.Generation {
			w.t.Errorf("manifest lists %s at generation %d; the bucket holds %v", f.Name, f.Generation, a)
		}
	}
}

func TestPromoteCopiesTheBestAdapterAndWritesTheManifest(t *testing.T) {
	w := newFakeWorld(t)
	best := w.checkpoint("r1", 20, 0.50)
	latest := w.checkpoint("r1", 30, 0.55)
	run := succeeded("r1", t0, best, latest)
	w.deliver(published(t, raydropEvent(t, run)))

	w.assertLatest("r1", best)
	objs := w.objects()
	m := w.manifest()
	wantFiles := []File{}
	for _, f := range checkpoints.AdapterFiles {
		src, err := w.gcs.Bucket(checkpointBucket).Object(strings.TrimPrefix(best.URI, "gs://"+checkpointBucket+"/") + "/" + f).Attrs(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		a := objs[folder+f]
		wantFiles = append(wantFiles, File{
			Name: f, URI: "gs://" + modelBucket + "/" + folder + f, Generation: a.Generation, Size: int64(len(content("r1", 20, f))),
			SourceURI: best.URI + "/" + f, SourceGeneration: src.Generation,
		})
		if a.CacheControl != cacheControl || a.ContentType != "application/octet-stream" {
			t.Errorf("%s: cache control %q, content type %q", f, a.CacheControl, a.ContentType)
		}
	}
	want := Manifest{
		RunID: "r1", Name: runName, EventID: "r1/succeeded", EndedAt: t0, Source: run.Source,
		Checkpoint: "checkpoint_000002", CheckpointURI: best.URI, Selected: "bestCheckpoint",
		Step: 20, Epoch: 1, BestBy: "eval_loss", Metrics: best.Metrics, FinalMetrics: run.FinalMetrics,
		Files: wantFiles,
	}
	if got, _ := json.Marshal(m); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("manifest:\n got %s\nwant %s", got, must(json.Marshal(want)))
	}
	if a := objs[folder+ManifestFile]; a.ContentType != "application/json" || a.Metadata[MetaEventID] != "r1/succeeded" || a.Metadata[MetaEndedAt] != t0.Format(time.RFC3339Nano) {
		t.Errorf("manifest object: content type %q, metadata %v", a.ContentType, a.Metadata)
	}
	if l := w.logged("adapter_promoted"); len(l) != 1 || l[0]["run_id"] != "r1" || l[0]["severity"] != "INFO" {
		t.Errorf("adapter_promoted logged %v\n%s", l, w.logs)
	}
}

func TestPromoteFallsBackToTheLatestCheckpoint(t *testing.T) {
	w := newFakeWorld(t)
	latest := w.checkpoint("r1", 30, 0.55)
	run := succeeded("r1", t0, latest)
	run.BestCheckpoint, run.BestBy = nil, ""
	w.deliver(published(t, raydropEvent(t, run)))

	w.assertLatest("r1", latest)
	if m := w.manifest(); m.Selected != "latestCheckpoint" || m.BestBy != "" {
		t.Errorf("manifest says selected %q, bestBy %q; want latestCheckpoint and no bestBy", m.Selected, m.BestBy)
	}
}

// A raydrop event delivered as it is (an Eventarc Advanced bus) promotes
// the same way.
func TestDirectDelivery(t *testing.T) {
	w := newFakeWorld(t)
	best := w.checkpoint("r1", 20, 0.5)
	w.deliver(raydropEvent(t, succeeded("r1", t0, best)))
	w.assertLatest("r1", best)
}

func TestRedeliveryRewritesNothing(t *testing.T) {
	w := newFakeWorld(t)
	e := raydropEvent(t, succeeded("r1", t0, w.checkpoint("r1", 20, 0.5)))
	w.deliver(published(t, e))
	before := w.generations()

	// The same message again, a copy published again under the same
	// CloudEvent ID, and the event delivered directly.
	first := published(t, e)
	for _, again := range []event.Event{first, first, published(t, e), e} {
		w.deliver(again)
	}
	if after := w.generations(); !maps.Equal(before, after) {
		t.Errorf("a redelivery rewrote objects: generations %v, then %v", before, after)
	}
	if n := len(w.logged("duplicate_ignored")); n != 4 {
		t.Errorf("duplicate_ignored logged %d times, want 4\n%s", n, w.logs)
	}
}

// A delivery that died after copying the files but before the manifest
// is finished by the next one, which copies nothing again.
func TestRedeliveryFinishesAnInterruptedPromotion(t *testing.T) {
	w := newFakeWorld(t)
	best := w.checkpoint("r1", 20, 0.5)
	e := published(t, raydropEvent(t, succeeded("r1", t0, best)))
	w.deliver(e)
	if err := w.gcs.Bucket(modelBucket).Object(folder + ManifestFile).Delete(w.ctx); err != nil {
		t.Fatal(err)
	}
	before := w.generations()

	w.deliver(e)
	after := w.generations()
	for n, g := range before {
		if after[n] != g {
			t.Errorf("%s was copied again (generation %d, then %d)", n, g, after[n])
		}
	}
	w.assertLatest("r1", best)
}

func TestOlderRunChangesNothing(t *testing.T) {
	w := newFakeWorld(t)
	newer := w.checkpoint("r2", 40, 0.4)
	older := w.checkpoint("r1", 20, 0.5)
	w.deliver(published(t, raydropEvent(t, succeeded("r2", t0.Add(time.Hour), newer))))
	before := w.generations()

	w.deliver(published(t, raydropEvent(t, succeeded("r1", t0, older))))
	if after := w.generations(); !maps.Equal(before, after) {
		t.Errorf("an older run's event rewrote objects: generations %v, then %v", before, after)
	}
	w.assertLatest("r2", newer)
	if l := w.logged("older_run_ignored"); len(l) != 1 || l[0]["run_id"] != "r1" || l[0]["current_run_id"] != "r2" {
		t.Errorf("older_run_ignored logged %v\n%s", l, w.logs)
	}
}

// An older run's event that arrives while a newer run is copying (its
// files there, its manifest not yet) stops at the first newer file.
func TestOlderRunStopsAtANewerRunsFile(t *testing.T) {
	w := newFakeWorld(t)
	newer := w.checkpoint("r2", 40, 0.4)
	w.deliver(published(t, raydropEvent(t, succeeded("r2", t0.Add(time.Hour), newer))))
	if err := w.gcs.Bucket(modelBucket).Object(folder + ManifestFile).Delete(w.ctx); err != nil {
		t.Fatal(err)
	}
	before := w.generations()

	w.deliver(published(t, raydropEvent(t, succeeded("r1", t0, w.checkpoint("r1", 20, 0.5)))))
	if after := w.generations(); !maps.Equal(before, after) {
		t.Errorf("an older run's event wrote objects: generations %v, then %v", before, after)
	}
	if n := len(w.logged("older_run_ignored")); n != 1 {
		t.Errorf("older_run_ignored logged %d times, want 1\n%s", n, w.logs)
	}
}

func TestNewerRunReplacesOlder(t *testing.T) {
	w := newFakeWorld(t)
	w.deliver(published(t, raydropEvent(t, succeeded("r1", t0, w.checkpoint("r1", 20, 0.5)))))
	before := w.generations()
	newer := w.checkpoint("r2", 40, 0.4)

	w.deliver(published(t, raydropEvent(t, succeeded("r2", t0.Add(time.Minute), newer))))
	w.assertLatest("r2", newer)
	after := w.generations()
	for n, g := range before {
		if after[n] == g {
			t.Errorf("%s kept generation %d", n, g)
		}
	}
}

// Runs that ended at the same instant are ordered by run ID, so the
// outcome does not depend on which event comes first.
func TestRunsEndingTogetherAreOrderedByID(t *testing.T) {
	for _, order := range [][]string{{"ra", "rb"}, {"rb", "ra"}} {
		t.Run(strings.Join(order, "-then-"), func(t *testing.T) {
			w := newFakeWorld(t)
			cks := map[string]checkpoints.Checkpoint{"ra": w.checkpoint("ra", 20, 0.5), "rb": w.checkpoint("rb", 30, 0.6)}
			for _, id := range order {
				w.deliver(published(t, raydropEvent(t, succeeded(id, t0, cks[id]))))
			}
			w.assertLatest("rb", cks["rb"])
		})
	}
}

func TestOtherEventsAreIgnored(t *testing.T) {
	w := newFakeWorld(t)
	ck := w.checkpoint("r1", 20, 0.5)
	var cases []event.Event
	for _, phase := range events.Phases {
		if events.Type(phase) == Succeeded || events.Type(phase) == ReportReady {
			continue
		}
		run := succeeded("r1", t0, ck) // a terminal event carries checkpoints too
		run.Phase = phase
		e := raydropEvent(t, run)
		cases = append(cases, published(t, e), e)
	}
	if len(cases) < 10 {
		t.Fatalf("only %d events of other phases: %v", len(cases), events.Phases)
	}
	// A sweep's own events name checkpoints too: its trials' succeeded
	// events promote them, the sweep's is ignored.
	for _, phase := range events.SweepPhases {
		e, err := events.NewSweep("//raydrop.dev/raydrop", events.Sweep{SweepID: "s1", Name: "s", Phase: phase, StartedAt: t0,
			Best: &events.SweepTrial{Index: 1, RunID: "r1", Outcome: "succeeded", BestCheckpoint: ck.URI}}, t0)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, published(t, e), e)
	}
	other := event.New()
	other.SetID("1")
	other.SetType("google.cloud.storage.object.v1.finalized")
	other.SetSource("//storage.googleapis.com/projects/_/buckets/" + checkpointBucket)
	cases = append(cases, other)

	for _, e := range cases {
		w.deliver(e)
	}
	if objs := w.objects(); len(objs) != 0 {
		t.Errorf("ignored events wrote %v", slices.Collect(maps.Keys(objs)))
	}
	if n := len(w.logged("event_ignored")); n != len(cases) {
		t.Errorf("event_ignored logged %d times, want %d\n%s", n, len(cases), w.logs)
	}
}

// TestReportReadyIsLogged: the event that announces a run's report is
// logged with the report's address, in either delivery, and writes
// nothing; one without a gs:// report is acknowledged as malformed.
func TestReportReadyIsLogged(t *testing.T) {
	w := newFakeWorld(t)
	uri := "gs://" + checkpointBucket + "/raydrop/r1/report.html"
	run := events.Run{RunID: "r1", Name: "colours", Source: "gs://intake/jobs/colours.json#1", Phase: events.ReportReady, Outcome: "succeeded", Report: uri}
	e := raydropEvent(t, run)
	w.deliver(published(t, e))
	w.deliver(e)
	run.Report = ""
	w.deliver(raydropEvent(t, run))
	if objs := w.objects(); len(objs) != 0 {
		t.Errorf("report events wrote %v", slices.Collect(maps.Keys(objs)))
	}
	lines := w.logged("report_ready")
	if len(lines) != 2 {
		t.Fatalf("report_ready logged %d times, want 2\n%s", len(lines), w.logs)
	}
	for _, l := range lines {
		if l["report"] != uri || l["run_id"] != "r1" || l["outcome"] != "succeeded" {
			t.Errorf("report_ready line %v", l)
		}
	}
	if n := len(w.logged("event_dropped")); n != 1 {
		t.Errorf("event_dropped logged %d times for the event without a report, want 1\n%s", n, w.logs)
	}
}

// A malformed event is acknowledged (nil: no redelivery would fix it)
// with one error line saying what is wrong, and writes nothing.
func TestMalformedEventsAreAckedAndLogged(t *testing.T) {
	w := newFakeWorld(t)
	good := w.checkpoint("r1", 20, 0.5)
	incomplete := w.checkpoint("r2", 20, 0.5, "adapter_config.json")
	goodEvent := raydropEvent(t, succeeded("r1", t0, good))
	with := func(f func(*events.Run)) event.Event {
		run := succeeded("r1", t0, good)
		f(&run)
		return published(t, raydropEvent(t, run))
	}
	withAttrs := func(f func(map[string]string)) event.Event {
		attrs := events.PubSubAttributes(goodEvent)
		f(attrs)
		return envelope(t, attrs, goodEvent.Data())
	}
	notJSON := envelope(t, nil, nil)
	if err := notJSON.SetData("text/plain", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		event event.Event
		want  string
	}{
		{"envelope not JSON", notJSON, "decode the Pub/Sub message"},
		{"message not a CloudEvent", withAttrs(func(a map[string]string) { clear(a) }), "no ce-type attribute"},
		{"bad ce-time", withAttrs(func(a map[string]string) { a["ce-time"] = "yesterday" }), `ce-time "yesterday"`},
		{"no ce-source", withAttrs(func(a map[string]string) { delete(a, "ce-source") }), "source"},
		{"data not JSON", envelope(t, events.PubSubAttributes(goodEvent), []byte("{runId")), "is not a valid CloudEvent: json"},
		{"data not a run", envelope(t, events.PubSubAttributes(goodEvent), []byte(`{"runId": 1}`)), "decode data of event r1/succeeded"},
		{"no end", with(func(r *events.Run) { r.EndedAt = nil }), "endedAt is missing"},
		{"no checkpoint", with(func(r *events.Run) { r.BestCheckpoint, r.LatestCheckpoint = nil, nil }), "neither a bestCheckpoint nor a latestCheckpoint"},
		{"checkpoint not in a bucket", with(func(r *events.Run) { r.BestCheckpoint.URI = "/tmp/checkpoint" }), `checkpoint uri "/tmp/checkpoint" is not gs://`},
		{"name not a folder", with(func(r *events.Run) { r.Name = "../../etc" }), `name "../../etc" is not a label value`},
		{"bad run ID", with(func(r *events.Run) { r.RunID = "R 1" }), `runId "R 1"`},
		{"checkpoint without the adapter", published(t, raydropEvent(t, succeeded("r2", t0, incomplete))), "holds no adapter_config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.logs.Reset()
			if err := w.h.Handle(w.ctx, tc.event); err != nil {
				t.Fatalf("Handle = %v, want nil (acknowledged)", err)
			}
			l := w.logged("event_dropped")
			if len(l) != 1 || l[0]["severity"] != "ERROR" || !strings.Contains(fmt.Sprint(l[0]["error"]), tc.want) {
				t.Errorf("want one ERROR event_dropped line whose error says %q; logs:\n%s", tc.want, w.logs)
			}
			if objs := w.objects(); len(objs) != 0 {
				t.Errorf("wrote %v", slices.Collect(maps.Keys(objs)))
			}
		})
	}
}

// A failure a later attempt may not meet is returned, so the platform
// delivers the event again; the later delivery promotes the run.
func TestTransientFailureIsReturned(t *testing.T) {
	w := newWorld(t, gcstest.New(t, checkpointBucket)) // no destination bucket yet
	best := w.checkpoint("r1", 20, 0.5)
	e := published(t, raydropEvent(t, succeeded("r1", t0, best)))
	if err := w.h.Handle(w.ctx, e); err == nil || IsPermanent(err) {
		t.Fatalf("Handle = %v, want a transient error", err)
	}
	if l := w.logged("event_retry"); len(l) != 1 || l[0]["severity"] != "WARNING" || l[0]["run_id"] != "r1" {
		t.Errorf("want one WARNING event_retry line for r1; logs:\n%s", w.logs)
	}

	if err := w.gcs.Bucket(modelBucket).Create(w.ctx, "team", nil); err != nil {
		t.Fatal(err)
	}
	w.deliver(e)
	w.assertLatest("r1", best)
}

func TestStampOrder(t *testing.T) {
	a := stamp{runID: "ra", endedAt: t0}
	for _, tc := range []struct {
		s, o        stamp
		same, after bool
	}{
		{a, a, true, false},
		{a, stamp{runID: "ra", endedAt: t0.In(time.FixedZone("x", 3600))}, true, false},
		{stamp{runID: "ra", endedAt: t0.Add(time.Nanosecond)}, a, false, true},
		{a, stamp{runID: "rb", endedAt: t0.Add(-time.Hour)}, false, true},
		{stamp{runID: "rb", endedAt: t0}, a, false, true},
		{a, stamp{runID: "rb", endedAt: t0}, false, false},
		{a, stamp{}, false, true},
	} {
		if got := tc.s.same(tc.o); got != tc.same {
			t.Errorf("%v.same(%v) = %v", tc.s, tc.o, got)
		}
		if got := tc.s.after(tc.o); got != tc.after {
			t.Errorf("%v.after(%v) = %v", tc.s, tc.o, got)
		}
	}
	// The stamp survives the metadata round trip, to the nanosecond.
	s := stamp{runID: "r1", endedAt: t0.Add(123456789 * time.Nanosecond)}
	if got := stampOf(s.metadata("e")); !got.same(s) {
		t.Errorf("stampOf(metadata(%v)) = %v", s, got)
	}
	if got := stampOf(map[string]string{MetaRunID: "r1", MetaEndedAt: "soon"}); got != (stamp{}) {
		t.Errorf("a malformed stamp reads as %v, want the zero stamp", got)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
