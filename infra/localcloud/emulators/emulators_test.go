package emulators_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
)

const project = "raydrop-local"

// pushBody is the body of a Pub/Sub push request (the wrapped format).
type pushBody struct {
	Message struct {
		Data        []byte            `json:"data"`
		Attributes  map[string]string `json:"attributes"`
		MessageID   string            `json:"messageId"`
		PublishTime string            `json:"publishTime"`
	} `json:"message"`
	Subscription string `json:"subscription"`
}

// recorder is a push endpoint: /ok acknowledges, /fail answers 500.
type recorder struct {
	mu     sync.Mutex
	pushes map[string][]pushBody // path -> pushes in arrival order
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, err := io.ReadAll(req.Body)
	var p pushBody
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.pushes[req.URL.Path] = append(r.pushes[req.URL.Path], p)
	r.mu.Unlock()
	if req.URL.Path == "/fail" {
		http.Error(w, "failing on purpose", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *recorder) get(path string) []pushBody {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pushBody(nil), r.pushes[path]...)
}

// eventually polls cond every 50 ms until it holds or the timeout passes.
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

// dumpLogsOnFailure prints the emulators' logs when the test fails.
func dumpLogsOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("--- %s ---\n%s", filepath.Base(l), b)
		}
	})
}

func TestEmulators(t *testing.T) {
	binary, err := emulators.FakeGCSBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	logDir := t.TempDir()
	dumpLogsOnFailure(t, logDir)

	start := time.Now()
	ps, err := emulators.StartPubSub(ctx, project, logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Stop() })
	t.Logf("pubsub emulator on %s in %v", ps.Host, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	gcs, err := emulators.StartStorage(ctx, binary, ps, "storage-events", logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gcs.Stop() })
	t.Logf("fake-gcs-server on %s in %v", gcs.Host, time.Since(start).Round(time.Millisecond))

	rec := &recorder{pushes: map[string][]pushBody{}}
	endpoint := httptest.NewServer(rec)
	defer endpoint.Close()

	// CreateTopics is idempotent; StartStorage created this one already.
	if err := ps.CreateTopics(ctx, "storage-events", "storage-events"); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []emulators.Trigger{
		{Name: "push-ok", Topic: "storage-events", PushEndpoint: endpoint.URL + "/ok", AckDeadline: 10 * time.Second},
		// No backoff: the emulator redelivers about every second.
		{Name: "push-fail", Topic: "storage-events", PushEndpoint: endpoint.URL + "/fail", MaxDeliveryAttempts: 5},
	} {
		if err := ps.CreatePushSubscription(ctx, tr); err != nil {
			t.Fatal(err)
		}
	}

	client, err := gcs.NewClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	if err := client.Bucket("uploads").Create(ctx, project, nil); err != nil {
		t.Fatal(err)
	}
	w := client.Bucket("uploads").Object("in/a.json").If(storage.Conditions{DoesNotExist: true}).NewWriter(ctx)
	w.ContentType = "application/json"
	if _, err := io.WriteString(w, `{"a":1}`); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	uploaded := time.Now()

	// The object reads back through the client (the XML API at the public host).
	r, err := client.Bucket("uploads").Object("in/a.json").NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	content, err := io.ReadAll(r)
	_ = r.Close()
	if err != nil || string(content) != `{"a":1}` {
		t.Fatalf("read back %q, %v", content, err)
	}

	// The notification arrives at the push subscription.
	eventually(t, 10*time.Second, "the OBJECT_FINALIZE push", func() bool { return len(rec.get("/ok")) > 0 })
	t.Logf("upload -> push in %v", time.Since(uploaded).Round(time.Millisecond))
	got := rec.get("/ok")[0]
	a := got.Message.Attributes
	if a["eventType"] != "OBJECT_FINALIZE" || a["bucketId"] != "uploads" || a["objectId"] != "in/a.json" ||
		a["payloadFormat"] != "JSON_API_V1" || a["objectGeneration"] == "" {
		t.Errorf("attributes = %v", a)
	}
	var obj struct{ Bucket, Name, ContentType string }
	if err := json.Unmarshal(got.Message.Data, &obj); err != nil || obj.Bucket != "uploads" || obj.Name != "in/a.json" ||
		obj.ContentType != "application/json" {
		t.Errorf("data = %s (%v)", got.Message.Data, err)
	}
	if got.Subscription != "projects/"+project+"/subscriptions/push-ok" || got.Message.MessageID == "" || got.Message.PublishTime == "" {
		t.Errorf("push = %+v", got)
	}

	// The failing endpoint gets the message 5 times, then it is dead-lettered.
	eventually(t, 20*time.Second, "the failing push to be dead-lettered", func() bool {
		n, err := ps.DeadLettered(ctx, "push-fail")
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	t.Logf("upload -> dead-lettered in %v", time.Since(uploaded).Round(time.Millisecond))
	if n := len(rec.get("/fail")); n != 5 {
		t.Errorf("failing endpoint got %d deliveries, want 5", n)
	}
	for _, p := range rec.get("/fail") {
		if p.Message.MessageID != rec.get("/fail")[0].Message.MessageID {
			t.Errorf("failing endpoint got another message: %+v", p)
		}
	}
	if n, err := ps.DeadLettered(ctx, "push-fail"); err != nil || n != 1 {
		t.Errorf("DeadLettered(push-fail) again = %d, %v; want the running total 1", n, err)
	}
	if n, err := ps.DeadLettered(ctx, "push-ok"); err != nil || n != 0 {
		t.Errorf("DeadLettered(push-ok) = %d, %v; want 0", n, err)
	}
	if n := len(rec.get("/ok")); n != 1 {
		t.Errorf("acknowledging endpoint got %d deliveries, want 1", n)
	}

	// Stop frees the ports.
	for _, s := range []interface {
		Stop() error
	}{gcs, ps} {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	}
	for _, host := range []string{ps.Host, gcs.Host} {
		l, err := net.Listen("tcp", host)
		if err != nil {
			t.Errorf("port of a stopped emulator still taken: %v", err)
			continue
		}
		_ = l.Close()
	}
	if err := ps.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestFakeGCSBinaryMissing(t *testing.T) {
	t.Setenv(emulators.FakeGCSEnv, "")
	t.Setenv("RAYDROP_CACHE", t.TempDir())
	_, err := emulators.FakeGCSBinary()
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("err = %v, want a message saying how to build it", err)
	}
}

// TestEmulatorDiesWithParent kills a process that started fake-gcs-server
// without stopping it, and expects the emulator to die with it.
func TestEmulatorDiesWithParent(t *testing.T) {
	if os.Getenv("EMULATORS_TEST_PARENT") == "1" {
		binary, err := emulators.FakeGCSBinary()
		if err != nil {
			t.Fatal(err)
		}
		gcs, err := emulators.StartStorage(context.Background(), binary, nil, "", "")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("HOST", gcs.Host)
		select {} // until killed
	}
	if _, err := emulators.FakeGCSBinary(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmulatorDiesWithParent$", "-test.v")
	cmd.Env = append(os.Environ(), "EMULATORS_TEST_PARENT=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var host string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), "HOST "); ok {
			host = h
			break
		}
	}
	if host == "" {
		t.Fatal("the parent process did not start fake-gcs-server")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	eventually(t, 10*time.Second, "fake-gcs-server to die with its parent", func() bool {
		l, err := net.Listen("tcp", host)
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	})
}
