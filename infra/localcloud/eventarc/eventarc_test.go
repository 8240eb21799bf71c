package eventarc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
)

const project = "raydrop-local"

// received is one request a fake function got.
type received struct {
	header http.Header
	id     string
	typ    string
	source string
	subj   string
	time   time.Time
	ctype  string
	bucket string
	data   []byte
}

// functions are fake Cloud Run functions, one per path, that parse each
// request into a CloudEvent with the CloudEvents SDK. /flaky fails the first
// delivery of every event with 500.
type functions struct {
	mu   sync.Mutex
	got  map[string][]received
	seen map[string]bool
}

func (f *functions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	header := r.Header.Clone()
	ev, err := cehttp.NewEventFromHTTPRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rec := received{header: header, id: ev.ID(), typ: ev.Type(), source: ev.Source(), subj: ev.Subject(),
		time: ev.Time(), ctype: ev.DataContentType(), data: ev.Data()}
	if b, ok := ev.Extensions()["bucket"].(string); ok {
		rec.bucket = b
	}
	f.mu.Lock()
	f.got[r.URL.Path] = append(f.got[r.URL.Path], rec)
	first := !f.seen[r.URL.Path+" "+ev.ID()]
	f.seen[r.URL.Path+" "+ev.ID()] = true
	f.mu.Unlock()
	if r.URL.Path == "/flaky" && first {
		http.Error(w, "failing the first delivery", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (f *functions) get(path string) []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.got[path]...)
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestThroughEmulators runs uploads and publishes through fake-gcs-server,
// the Pub/Sub emulator and the adapter to fake functions.
func TestThroughEmulators(t *testing.T) {
	binary, err := emulators.FakeGCSBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	logDir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("--- %s ---\n%s", filepath.Base(l), b)
			}
		}
	})
	ps, err := emulators.StartPubSub(ctx, project, logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Stop() })
	gcs, err := emulators.StartStorage(ctx, binary, ps, "storage-events", logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gcs.Stop() })

	fns := &functions{got: map[string][]received{}, seen: map[string]bool{}}
	fn := httptest.NewServer(fns)
	defer fn.Close()

	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- adapter log ---\n%s", logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := eventarc.New([]eventarc.Route{
		{Name: "uploads", Kind: eventarc.StorageFinalized, Target: fn.URL + "/uploads", Bucket: "uploads"},
		{Name: "jobs", Kind: eventarc.PubSubPublished, Target: fn.URL + "/jobs", Topic: ps.TopicName("jobs")},
		{Name: "flaky", Kind: eventarc.PubSubPublished, Target: fn.URL + "/flaky", Topic: ps.TopicName("flaky")},
	}, log, nil)
	if _, err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()

	if err := ps.CreateTopics(ctx, "jobs", "flaky"); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []emulators.Trigger{
		{Name: "trigger-uploads", Topic: "storage-events", PushEndpoint: a.PushEndpoint("uploads")},
		{Name: "trigger-jobs", Topic: "jobs", PushEndpoint: a.PushEndpoint("jobs")},
		{Name: "trigger-flaky", Topic: "flaky", PushEndpoint: a.PushEndpoint("flaky")},
	} {
		if err := ps.CreatePushSubscription(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}

	// Storage: an upload to the trigger's bucket reaches the function as a
	// finalized event; one to another bucket and a delete do not.
	client, err := gcs.NewClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	for _, b := range []string{"uploads", "other"} {
		if err := client.Bucket(b).Create(ctx, project, nil); err != nil {
			t.Fatal(err)
		}
		w := client.Bucket(b).Object("in/job 1.json").NewWriter(ctx)
		w.ContentType = "application/json"
		if _, err := io.WriteString(w, `{"job":1}`); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.Bucket("uploads").Object("in/job 1.json").Delete(ctx); err != nil {
		t.Fatal(err)
	}

	// Pub/Sub: a publish reaches its function; a 500 gets it redelivered.
	psc, err := ps.NewClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = psc.Close() }()
	publish := func(topic string, m *pubsub.Message) string {
		pub := psc.Publisher(topic)
		defer pub.Stop()
		id, err := pub.Publish(ctx, m).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	jobID := publish("jobs", &pubsub.Message{Data: []byte(`{"run":"r1"}`), Attributes: map[string]string{"origin": "test"}})
	flakyID := publish("flaky", &pubsub.Message{Data: []byte("again")})

	eventually(t, 15*time.Second, "the finalized event, the publish, the redelivery and two dropped pushes", func() bool {
		return len(fns.get("/uploads")) >= 1 && len(fns.get("/jobs")) >= 1 && len(fns.get("/flaky")) >= 2 &&
			a.Stats()["uploads"].Ignored >= 2
	})

	// The finalized event, as Eventarc sends it: the ce-subject header
	// percent-encoded as the CloudEvents HTTP binding requires.
	up := fns.get("/uploads")
	if len(up) != 1 {
		t.Fatalf("uploads function got %d events, want 1: %+v", len(up), up)
	}
	e := up[0]
	if e.typ != "google.cloud.storage.object.v1.finalized" ||
		e.source != "//storage.googleapis.com/projects/_/buckets/uploads" ||
		e.subj != "objects/in/job%201.json" || e.bucket != "uploads" || e.ctype != "application/json" ||
		e.id == "" || e.time.IsZero() || time.Since(e.time) > time.Minute {
		t.Errorf("finalized event = %+v", e)
	}
	var obj struct{ Bucket, Name, ContentType, Size, Generation string }
	if err := json.Unmarshal(e.data, &obj); err != nil || obj.Bucket != "uploads" || obj.Name != "in/job 1.json" ||
		obj.ContentType != "application/json" || obj.Size != "9" || obj.Generation == "" {
		t.Errorf("finalized data = %s (%v)", e.data, err)
	}
	// Binary content mode: attributes in ce-* headers, the data as the body.
	if e.header.Get("Ce-Specversion") != "1.0" || e.header.Get("Ce-Type") == "" ||
		!strings.HasPrefix(e.header.Get("Content-Type"), "application/json") {
		t.Errorf("not binary content mode: %v", e.header)
	}

	// The messagePublished event.
	jobs := fns.get("/jobs")
	if len(jobs) != 1 {
		t.Fatalf("jobs function got %d events, want 1", len(jobs))
	}
	j := jobs[0]
	if j.typ != "google.cloud.pubsub.topic.v1.messagePublished" ||
		j.source != "//pubsub.googleapis.com/projects/"+project+"/topics/jobs" || j.id != jobID ||
		j.ctype != "application/json" || j.time.IsZero() {
		t.Errorf("messagePublished event = %+v (published id %s)", j, jobID)
	}
	var pd struct {
		Message struct {
			Data        []byte            `json:"data"`
			Attributes  map[string]string `json:"attributes"`
			MessageID   string            `json:"messageId"`
			PublishTime time.Time         `json:"publishTime"`
		} `json:"message"`
		Subscription string `json:"subscription"`
	}
	if err := json.Unmarshal(j.data, &pd); err != nil || string(pd.Message.Data) != `{"run":"r1"}` ||
		pd.Message.Attributes["origin"] != "test" || pd.Message.MessageID != jobID || pd.Message.PublishTime.IsZero() ||
		pd.Subscription != "projects/"+project+"/subscriptions/trigger-jobs" {
		t.Errorf("messagePublished data = %s (%v)", j.data, err)
	}

	// The 500 made Pub/Sub redeliver; the 200 that followed ended it.
	flaky := fns.get("/flaky")
	if len(flaky) != 2 || flaky[0].id != flakyID || flaky[1].id != flakyID {
		t.Errorf("flaky function got %+v, want the message %s twice", flaky, flakyID)
	}
	st := a.Stats()
	if s := st["flaky"]; s.Deliveries != 2 || s.Codes[500] != 1 || s.Codes[200] != 1 {
		t.Errorf("flaky stats = %+v", s)
	}
	if s := st["uploads"]; s.Deliveries != 1 || s.Ignored != 2 || s.Codes[200] != 1 || s.BadPushes != 0 {
		t.Errorf("uploads stats = %+v", s)
	}
	if s := st["jobs"]; s.Deliveries != 1 || s.Codes[200] != 1 {
		t.Errorf("jobs stats = %+v", s)
	}
	if n, err := ps.DeadLettered(ctx, "trigger-flaky"); err != nil || n != 0 {
		t.Errorf("dead-lettered from trigger-flaky: %d, %v", n, err)
	}
}

// pushBody is a push request as the Pub/Sub emulator sends it.
const pushBody = `{"subscription":"projects/p/subscriptions/s","message":{"data":"eyJuYW1lIjoiYSJ9",` +
	`"attributes":{"eventType":"OBJECT_FINALIZE","bucketId":"b","objectId":"a","payloadFormat":"JSON_API_V1",` +
	`"eventTime":"2026-01-02T03:04:05Z"},"messageId":"7","publishTime":"2026-01-02T03:04:05.678Z"}}`

func serve(a *eventarc.Adapter, path, body string) int {
	w := httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return w.Code
}

func TestUnreachableFunction(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	_ = l.Close()
	a := eventarc.New([]eventarc.Route{{Name: "r", Kind: eventarc.StorageFinalized, Target: dead, Bucket: "b"}}, nil, nil)
	if code := serve(a, "/routes/r", pushBody); code != http.StatusServiceUnavailable {
		t.Errorf("push to an unreachable function answered %d, want 503", code)
	}
	if s := a.Stats()["r"]; s.Unreachable != 1 || s.Deliveries != 1 {
		t.Errorf("stats = %+v", s)
	}
}

func TestBadPushes(t *testing.T) {
	fns := &functions{got: map[string][]received{}, seen: map[string]bool{}}
	fn := httptest.NewServer(fns)
	defer fn.Close()
	a := eventarc.New([]eventarc.Route{
		{Name: "r", Kind: eventarc.StorageFinalized, Target: fn.URL + "/r", Bucket: "b"},
	}, nil, nil)
	for _, body := range []string{
		`not json`,
		`{"message":{"data":"e30="}}`, // no messageId
		strings.Replace(pushBody, `"objectId":"a",`, ``, 1),
		strings.Replace(pushBody, `JSON_API_V1`, `NONE`, 1),
		strings.Replace(pushBody, `eyJuYW1lIjoiYSJ9`, `bm90IGpzb24=`, 1), // data not JSON
	} {
		if code := serve(a, "/routes/r", body); code != http.StatusBadRequest {
			t.Errorf("push %s answered %d, want 400", body, code)
		}
	}
	if code := serve(a, "/routes/nope", pushBody); code != http.StatusNotFound {
		t.Errorf("push to an unknown route answered %d, want 404", code)
	}
	if code := serve(a, "/routes/r", pushBody); code != http.StatusOK {
		t.Errorf("good push answered %d, want 200", code)
	}
	got := fns.get("/r")
	if len(got) != 1 || got[0].subj != "objects/a" || !got[0].time.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		string(got[0].data) != `{"name":"a"}` {
		t.Errorf("function got %+v", got)
	}
	if s := a.Stats()["r"]; s.BadPushes != 5 || s.Deliveries != 1 || s.Pushes != 6 {
		t.Errorf("stats = %+v", s)
	}
}

func TestInvalidRoutes(t *testing.T) {
	for _, r := range []eventarc.Route{
		{Name: "", Kind: eventarc.StorageFinalized, Target: "http://127.0.0.1:1"},
		{Name: "x", Kind: eventarc.StorageFinalized, Target: "not a url"},
		{Name: "x", Kind: eventarc.PubSubPublished, Target: "http://127.0.0.1:1", Topic: "jobs"},
		{Name: "x", Kind: 0, Target: "http://127.0.0.1:1"},
	} {
		a := eventarc.New([]eventarc.Route{r}, nil, nil)
		if _, err := a.Start(context.Background()); err == nil {
			_ = a.Close()
			t.Errorf("Start accepted %+v", r)
		}
	}
}

// syncBuffer collects the adapter's log; deliveries may still log after the
// test ends.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPullDelivery: a route receiving from a pull subscription delivers as
// many events at once as its policy's concurrency and no more, redelivers a
// failed event after the retry policy's back-off, and forwards an event that
// failed every attempt to the dead-letter topic with Pub/Sub's attributes.
func TestPullDelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ps, err := emulators.StartPubSub(ctx, project, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Stop() })

	var mu sync.Mutex
	inFlight, most := 0, 0
	var failedAt []time.Time
	fn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fails" {
			mu.Lock()
			failedAt = append(failedAt, time.Now())
			mu.Unlock()
			http.Error(w, "always failing", http.StatusInternalServerError)
			return
		}
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer fn.Close()
	a := eventarc.New([]eventarc.Route{
		{Name: "slow", Kind: eventarc.PubSubPublished, Target: fn.URL + "/slow", Topic: ps.TopicName("slow")},
		{Name: "fails", Kind: eventarc.PubSubPublished, Target: fn.URL + "/fails", Topic: ps.TopicName("fails")},
	}, nil, nil)
	if err := ps.CreateTopics(ctx, "slow", "fails"); err != nil {
		t.Fatal(err)
	}
	pol := eventarc.Policy{Concurrency: 8, AckDeadline: 10 * time.Second, MinBackoff: time.Second, MaxBackoff: 2 * time.Second, MaxDeliveryAttempts: 5}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for _, route := range []string{"slow", "fails"} {
		if err := ps.CreateTriggerSubscription(ctx, emulators.Trigger{Name: "trigger-" + route, Topic: route, AckDeadline: pol.AckDeadline}); err != nil {
			t.Fatal(err)
		}
		p := pol
		p.DeadLetterTopic = ps.TopicName(emulators.DeadLetterTopic(route))
		wg.Go(func() {
			if err := a.Receive(rctx, route, ps.SubscriptionName("trigger-"+route), p, ps.Subscriber(), ps.Forward); err != nil {
				t.Error(err)
			}
		})
	}
	psc, err := ps.NewClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = psc.Close() }()
	publish := func(topic string, n int) {
		pub := psc.Publisher(topic)
		defer pub.Stop()
		var results []*pubsub.PublishResult
		for i := range n {
			results = append(results, pub.Publish(ctx, &pubsub.Message{Data: []byte{byte(i)}}))
		}
		for _, r := range results {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("slow", 40)
	publish("fails", 1)

	eventually(t, 30*time.Second, "40 deliveries and a dead-lettered message", func() bool {
		n, _ := ps.DeadLettered(ctx, "trigger-fails")
		return a.Stats()["slow"].Codes[200] == 40 && n == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if most != pol.Concurrency {
		t.Errorf("at most %d deliveries at once, want %d (the policy's concurrency)", most, pol.Concurrency)
	}
	if len(failedAt) != pol.MaxDeliveryAttempts {
		t.Errorf("the failing event was delivered %d times, want %d", len(failedAt), pol.MaxDeliveryAttempts)
	}
	for i := 1; i < len(failedAt); i++ {
		want := min(pol.MinBackoff<<(i-1), pol.MaxBackoff)
		if gap := failedAt[i].Sub(failedAt[i-1]); gap < want {
			t.Errorf("redelivery %d came %v after the failure, want at least the back-off %v", i, gap, want)
		}
	}
	dead := ps.DeadLetteredMessages("trigger-fails")
	if len(dead) != 1 || dead[0].Attributes["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" {
		t.Errorf("dead-lettered %+v, want one message after 5 deliveries", dead)
	}
}
