package subscriber

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"

	"github.com/raydrop/raydrop/pkg/gcstest"
)

// conditionalGCS is the in-process fake-gcs-server gcstest serves, plus
// the one Cloud Storage behaviour Promote relies on that the fake leaves
// out: the destination precondition of a copy (objects.rewrite with
// ifGenerationMatch, 0 for "does not exist"), which the fake ignores while
// it honours those of uploads. Every write is serialized, so a copy's check
// and write are one step, as on the server; and each gets a generation of
// its own (the fake takes it from the clock in microseconds).
func conditionalGCS(t testing.TB, buckets ...string) *storage.Client {
	t.Helper()
	srv := gcstest.Server(t, buckets...)
	h := &conditionalCopies{srv: srv, next: srv.HTTPHandler()}
	c, err := storage.NewClient(context.Background(), option.WithHTTPClient(&http.Client{Transport: handlerTransport{h}}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type conditionalCopies struct {
	mu   sync.Mutex
	srv  *fakestorage.Server
	next http.Handler
}

func (c *conditionalCopies) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		c.next.ServeHTTP(w, r)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bucket, name, ok := rewriteDestination(r); ok && r.URL.Query().Has("ifGenerationMatch") {
		want, err := strconv.ParseInt(r.URL.Query().Get("ifGenerationMatch"), 10, 64)
		var have int64
		if o, gerr := c.srv.GetObject(bucket, name); gerr == nil {
			have = o.Generation
		}
		if err != nil || have != want {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPreconditionFailed)
			_, _ = w.Write([]byte(`{"error":{"code":412,"message":"At least one of the pre-conditions you specified did not hold.","errors":[{"reason":"conditionNotMet"}]}}`))
			return
		}
	}
	c.next.ServeHTTP(w, r)
	time.Sleep(time.Microsecond) // the next write's generation is a later microsecond
}

// rewriteDestination is the destination of a copy request:
// /storage/v1/b/<bucket>/o/<object>/rewriteTo/b/<bucket>/o/<object>.
func rewriteDestination(r *http.Request) (bucket, name string, ok bool) {
	_, dest, ok := strings.Cut(r.URL.EscapedPath(), "/rewriteTo/b/")
	if !ok {
		return "", "", false
	}
	bucket, obj, ok := strings.Cut(dest, "/o/")
	name, err := url.PathUnescape(obj)
	return bucket, name, ok && err == nil
}

// handlerTransport sends requests to an in-process handler.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	return w.Result(), nil
}

// The race tests mean nothing if the fake lets a stale copy through.
func TestConditionalFakeRefusesAStaleCopy(t *testing.T) {
	w := newWorld(t, conditionalGCS(t, checkpointBucket, modelBucket))
	w.put(checkpointBucket, "a", []byte("a"))
	w.put(modelBucket, "b", []byte("old"))
	src, dst := w.gcs.Bucket(checkpointBucket).Object("a"), w.gcs.Bucket(modelBucket).Object("b")
	a, err := dst.Attrs(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.put(modelBucket, "b", []byte("newer"))

	for _, cond := range []storage.Conditions{{GenerationMatch: a.Generation}, {DoesNotExist: true}} {
		if _, err := dst.If(cond).CopierFrom(src).Run(w.ctx); !isPrecondition(err) {
			t.Errorf("copy under %+v over a changed object: %v, want 412", cond, err)
		}
	}
	if got := string(w.read(modelBucket, "b")); got != "newer" {
		t.Errorf("b holds %q after refused copies", got)
	}
	cur, err := dst.Attrs(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.If(storage.Conditions{GenerationMatch: cur.Generation}).CopierFrom(src).Run(w.ctx); err != nil {
		t.Errorf("copy under the current generation: %v", err)
	}
	if _, err := w.gcs.Bucket(modelBucket).Object("c").If(storage.Conditions{DoesNotExist: true}).CopierFrom(src).Run(w.ctx); err != nil {
		t.Errorf("copy to a new object under DoesNotExist: %v", err)
	}
}

// Two runs' events handled at once, each delivered twice (redeliveries
// racing each other), over a folder an older run already holds: whatever
// the interleaving, latest/ ends with the newer run's files and manifest
// only, and every delivery is acknowledged. Rounds give the scheduler many
// interleavings; run it under -race.
func TestConcurrentRunsEndWithTheNewer(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		w := newWorld(t, conditionalGCS(t, checkpointBucket, modelBucket))
		if round%2 == 0 {
			w.deliver(published(t, raydropEvent(t, succeeded("r0", t0.Add(-time.Hour), w.checkpoint("r0", 10, 0.9)))))
		}
		older := w.checkpoint("r1", 20, 0.5)
		newer := w.checkpoint("r2", 40, 0.4)
		var deliveries []event.Event
		for range 2 {
			deliveries = append(deliveries,
				published(t, raydropEvent(t, succeeded("r1", t0, older))),
				published(t, raydropEvent(t, succeeded("r2", t0.Add(time.Second), newer))))
		}
		start := make(chan struct{})
		errs := make([]error, len(deliveries))
		var wg sync.WaitGroup
		for i, e := range deliveries {
			wg.Go(func() {
				<-start
				errs[i] = w.h.Handle(w.ctx, e)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, w.logs)
		}
		w.assertLatest("r2", newer)
		if t.Failed() {
			t.Fatalf("round %d ended with a mix; logs:\n%s", round, w.logs)
		}
	}
}
