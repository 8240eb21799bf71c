package strictgcs_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/strictgcs"
)

const bucket = "strict"

// conditionNotMet is the message of Cloud Storage's 412.
const conditionNotMet = "At least one of the pre-conditions you specified did not hold."

// world is a real fake-gcs-server behind a faults.Proxy whose gate is a
// strictgcs.Gate, as the local cloud wires them, with one client per door.
type world struct {
	ctx     context.Context
	proxy   *faults.Proxy
	doors   map[string]string
	clients map[string]*storage.Client
}

func start(t *testing.T) *world {
	t.Helper()
	binary, err := emulators.FakeGCSBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	gcs, err := emulators.StartStorage(ctx, binary, nil, "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gcs.Stop() })
	gate, err := strictgcs.New(gcs.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.New("fake-gcs-server", gcs.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	proxy.SetGate(gate.Handle)
	w := &world{ctx: ctx, proxy: proxy, doors: map[string]string{}, clients: map[string]*storage.Client{}}
	if err := w.client(t, "a").Bucket(bucket).Create(ctx, "p", nil); err != nil {
		t.Fatal(err)
	}
	return w
}

// client is the Go client of one door.
func (w *world) client(t *testing.T, door string) *storage.Client {
	t.Helper()
	if c, ok := w.clients[door]; ok {
		return c
	}
	addr, err := w.proxy.Door(door)
	if err != nil {
		t.Fatal(err)
	}
	c, err := storage.NewClient(w.ctx, option.WithEndpoint("http://"+addr+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	w.doors[door], w.clients[door] = addr, c
	return c
}

func (w *world) put(t *testing.T, obj *storage.ObjectHandle, body string) *storage.ObjectAttrs {
	t.Helper()
	wr := obj.NewWriter(w.ctx)
	wr.ChunkSize = 0
	_, _ = io.WriteString(wr, body)
	if err := wr.Close(); err != nil {
		t.Fatalf("write %s: %v", obj.ObjectName(), err)
	}
	return wr.Attrs()
}

func read(t *testing.T, ctx context.Context, obj *storage.ObjectHandle) string {
	t.Helper()
	rd, err := obj.NewReader(ctx)
	if err != nil {
		t.Fatalf("read %s: %v", obj.ObjectName(), err)
	}
	defer func() { _ = rd.Close() }()
	b, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// want412 checks err is Cloud Storage's 412 conditionNotMet, as the JSON
// API sends it.
func want412(t *testing.T, what string, err error) {
	t.Helper()
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		t.Fatalf("%s: got %v, want Cloud Storage's 412", what, err)
	}
	if ge.Code != http.StatusPreconditionFailed || ge.Message != conditionNotMet || len(ge.Errors) != 1 || ge.Errors[0].Reason != "conditionNotMet" {
		t.Fatalf("%s: got %d %q %+v, want 412 %q with reason conditionNotMet", what, ge.Code, ge.Message, ge.Errors, conditionNotMet)
	}
}

// rawStatus sends a request through door a and returns its status and
// body.
func (w *world) raw(t *testing.T, method, path string) (int, string) {
	t.Helper()
	w.client(t, "a")
	req, err := http.NewRequestWithContext(w.ctx, method, "http://"+w.doors["a"]+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetagenerationCounts: a new generation's metageneration is 1 and
// each metadata update adds one, as every read reports it (resource,
// listing, download), through any door; ifMetagenerationMatch and
// ifMetagenerationNotMatch hold on reads, updates, deletes and uploads.
func TestMetagenerationCounts(t *testing.T) {
	w := start(t)
	a, b := w.client(t, "a"), w.client(t, "b")
	obj := a.Bucket(bucket).Object("runs/x/status.json")
	first := w.put(t, obj, "v1")
	if first.Metageneration != 1 {
		t.Fatalf("new object: metageneration %d, want 1", first.Metageneration)
	}
	up, err := obj.If(storage.Conditions{MetagenerationMatch: 1}).Update(w.ctx, storage.ObjectAttrsToUpdate{Metadata: map[string]string{"k": "1"}})
	if err != nil {
		t.Fatalf("update at metageneration 1: %v", err)
	}
	if up.Metageneration != 2 || up.Generation != first.Generation {
		t.Fatalf("after one update: generation %d metageneration %d, want %d and 2", up.Generation, up.Metageneration, first.Generation)
	}
	// Another door sees the same count: one table for every door.
	other := b.Bucket(bucket).Object(obj.ObjectName())
	if at, err := other.Attrs(w.ctx); err != nil || at.Metageneration != 2 {
		t.Fatalf("attrs through another door: %+v %v, want metageneration 2", at, err)
	}
	it := b.Bucket(bucket).Objects(w.ctx, &storage.Query{Prefix: "runs/"})
	if at, err := it.Next(); err != nil || at.Metageneration != 2 {
		t.Fatalf("listing: %+v %v, want metageneration 2", at, err)
	}
	rd, err := other.NewReader(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = rd.Close()
	if rd.Attrs.Metageneration != 2 {
		t.Fatalf("download: metageneration %d, want 2", rd.Attrs.Metageneration)
	}

	_, err = obj.If(storage.Conditions{MetagenerationMatch: 1}).Update(w.ctx, storage.ObjectAttrsToUpdate{ContentType: "text/plain"})
	want412(t, "update at a stale metageneration", err)
	_, err = obj.If(storage.Conditions{MetagenerationMatch: 1}).Attrs(w.ctx)
	want412(t, "get at a stale metageneration", err)
	err = obj.If(storage.Conditions{MetagenerationMatch: 1}).Delete(w.ctx)
	want412(t, "delete at a stale metageneration", err)
	wr := obj.If(storage.Conditions{MetagenerationMatch: 1}).NewWriter(w.ctx)
	wr.ChunkSize = 0
	_, _ = io.WriteString(wr, "v2")
	want412(t, "upload at a stale metageneration", wr.Close())
	// A resumable upload, checked when it begins.
	wr = obj.If(storage.Conditions{MetagenerationMatch: 1}).NewWriter(w.ctx)
	wr.ChunkSize = 256 << 10
	_, _ = io.WriteString(wr, strings.Repeat("x", 300<<10))
	want412(t, "resumable upload at a stale metageneration", wr.Close())
	if got := read(t, w.ctx, obj); got != "v1" {
		t.Fatalf("after refused writes the object holds %q, want v1", got)
	}
	// The raw answer: status and body as Cloud Storage sends them.
	status, body := w.raw(t, http.MethodGet, "/storage/v1/b/"+bucket+"/o/runs%2Fx%2Fstatus.json?ifMetagenerationMatch=1")
	var e struct {
		Error struct {
			Code    int
			Message string
			Errors  []struct{ Message, Domain, Reason string }
		}
	}
	if err := json.Unmarshal([]byte(body), &e); status != http.StatusPreconditionFailed || err != nil || e.Error.Code != 412 ||
		e.Error.Message != conditionNotMet || len(e.Error.Errors) != 1 || e.Error.Errors[0].Reason != "conditionNotMet" || e.Error.Errors[0].Domain != "global" {
		t.Fatalf("raw get at a stale metageneration: %d %s", status, body)
	}
	if status, _ := w.raw(t, http.MethodGet, "/storage/v1/b/"+bucket+"/o/runs%2Fx%2Fstatus.json?ifMetagenerationNotMatch=2"); status != http.StatusNotModified {
		t.Fatalf("get with ifMetagenerationNotMatch of the current one: %d, want 304", status)
	}

	if _, err := obj.If(storage.Conditions{MetagenerationMatch: 2}).Attrs(w.ctx); err != nil {
		t.Fatalf("get at the current metageneration: %v", err)
	}
	wr = obj.If(storage.Conditions{MetagenerationMatch: 2}).NewWriter(w.ctx)
	wr.ChunkSize = 0
	_, _ = io.WriteString(wr, "v2")
	if err := wr.Close(); err != nil {
		t.Fatalf("upload at the current metageneration: %v", err)
	}
	if at := wr.Attrs(); at.Metageneration != 1 || at.Generation == first.Generation {
		t.Fatalf("new generation: generation %d metageneration %d, want a new one at 1", at.Generation, at.Metageneration)
	}
	if err := obj.If(storage.Conditions{MetagenerationMatch: 1}).Delete(w.ctx); err != nil {
		t.Fatalf("delete at the current metageneration: %v", err)
	}
	// An upload that would create the object: no metageneration matches.
	wr = obj.If(storage.Conditions{MetagenerationMatch: 1}).NewWriter(w.ctx)
	wr.ChunkSize = 0
	_, _ = io.WriteString(wr, "v3")
	want412(t, "upload with ifMetagenerationMatch of an object that does not exist", wr.Close())
}

// TestMetagenerationCompareAndSwap: writers that update one object's
// metadata by compare-and-swap on its metageneration, through several
// doors at once, never lose an update.
func TestMetagenerationCompareAndSwap(t *testing.T) {
	w := start(t)
	doors := []string{"a", "b", "c", "d"}
	for _, d := range doors {
		w.client(t, d)
	}
	w.put(t, w.client(t, "a").Bucket(bucket).Object("counter"), "{}")
	const each = 5
	var wg sync.WaitGroup
	errs := make(chan error, len(doors)*each)
	for _, d := range doors {
		obj := w.client(t, d).Bucket(bucket).Object("counter")
		wg.Go(func() {
			for done := 0; done < each; {
				at, err := obj.Attrs(w.ctx)
				if err != nil {
					errs <- err
					return
				}
				n, _ := strconv.Atoi(at.Metadata["n"])
				_, err = obj.If(storage.Conditions{MetagenerationMatch: at.Metageneration}).
					Update(w.ctx, storage.ObjectAttrsToUpdate{Metadata: map[string]string{"n": strconv.Itoa(n + 1)}})
				var ge *googleapi.Error
				switch {
				case errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed:
				case err != nil:
					errs <- err
					return
				default:
					done++
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	at, err := w.client(t, "a").Bucket(bucket).Object("counter").Attrs(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := len(doors) * each
	if at.Metadata["n"] != strconv.Itoa(total) || at.Metageneration != int64(1+total) {
		t.Fatalf("after %d updates: n=%s metageneration %d, want n=%d metageneration %d", total, at.Metadata["n"], at.Metageneration, total, 1+total)
	}
}

// TestRewriteDestinationPreconditions: a copy or rewrite honours its
// destination's preconditions (and its source's).
func TestRewriteDestinationPreconditions(t *testing.T) {
	w := start(t)
	bk := w.client(t, "a").Bucket(bucket)
	src, dst := bk.Object("src"), bk.Object("dst")
	w.put(t, src, "new")
	old := w.put(t, dst, "old")

	_, err := dst.If(storage.Conditions{DoesNotExist: true}).CopierFrom(src).Run(w.ctx)
	want412(t, "copy over an existing object with ifGenerationMatch=0", err)
	_, err = dst.If(storage.Conditions{GenerationMatch: old.Generation + 1}).CopierFrom(src).Run(w.ctx)
	want412(t, "copy with another destination generation", err)
	_, err = dst.If(storage.Conditions{MetagenerationMatch: 2}).CopierFrom(src).Run(w.ctx)
	want412(t, "copy with another destination metageneration", err)
	_, err = dst.CopierFrom(src.If(storage.Conditions{GenerationMatch: old.Generation})).Run(w.ctx)
	want412(t, "copy with another source generation", err)
	if got := read(t, w.ctx, dst); got != "old" {
		t.Fatalf("after refused copies the destination holds %q, want old", got)
	}
	status, body := w.raw(t, http.MethodPost, "/storage/v1/b/"+bucket+"/o/src/rewriteTo/b/"+bucket+"/o/dst?ifGenerationMatch=0")
	if status != http.StatusPreconditionFailed || !strings.Contains(body, `"reason":"conditionNotMet"`) {
		t.Fatalf("raw rewrite over an existing object with ifGenerationMatch=0: %d %s", status, body)
	}

	at, err := dst.If(storage.Conditions{GenerationMatch: old.Generation, MetagenerationMatch: 1}).CopierFrom(src).Run(w.ctx)
	if err != nil {
		t.Fatalf("copy at the destination's generation: %v", err)
	}
	if got := read(t, w.ctx, dst); got != "new" || at.Generation == old.Generation || at.Metageneration != 1 {
		t.Fatalf("after the copy: %q generation %d metageneration %d", got, at.Generation, at.Metageneration)
	}
	if _, err := bk.Object("fresh").If(storage.Conditions{DoesNotExist: true}).CopierFrom(src).Run(w.ctx); err != nil {
		t.Fatalf("copy to a new object with ifGenerationMatch=0: %v", err)
	}
	_, err = bk.Object("absent").If(storage.Conditions{GenerationMatch: old.Generation}).CopierFrom(src).Run(w.ctx)
	want412(t, "copy to an object that does not exist with ifGenerationMatch", err)
}

// TestDeletePreconditions: a delete honours ifGenerationMatch (and the
// rest); one of an object that does not exist is 404 whatever its
// preconditions.
func TestDeletePreconditions(t *testing.T) {
	w := start(t)
	obj := w.client(t, "a").Bucket(bucket).Object("lease.json")
	at := w.put(t, obj, "v1")

	err := obj.If(storage.Conditions{GenerationMatch: at.Generation + 1}).Delete(w.ctx)
	want412(t, "delete at another generation", err)
	err = obj.If(storage.Conditions{DoesNotExist: true}).Delete(w.ctx)
	want412(t, "delete with ifGenerationMatch=0", err)
	status, body := w.raw(t, http.MethodDelete, "/storage/v1/b/"+bucket+"/o/lease.json?ifGenerationMatch=1")
	if status != http.StatusPreconditionFailed || !strings.Contains(body, conditionNotMet) {
		t.Fatalf("raw delete at another generation: %d %s", status, body)
	}
	if status, _ := w.raw(t, http.MethodDelete, "/storage/v1/b/"+bucket+"/o/lease.json?ifGenerationNotMatch="+strconv.FormatInt(at.Generation, 10)); status != http.StatusNotModified {
		t.Fatalf("delete with ifGenerationNotMatch of the current one: %d, want 304", status)
	}
	if got := read(t, w.ctx, obj); got != "v1" {
		t.Fatalf("after refused deletes the object holds %q", got)
	}

	if err := obj.If(storage.Conditions{GenerationMatch: at.Generation}).Delete(w.ctx); err != nil {
		t.Fatalf("delete at the current generation: %v", err)
	}
	if _, err := obj.Attrs(w.ctx); !errors.Is(err, storage.ErrObjectNotExist) {
		t.Fatalf("after the delete: %v, want no object", err)
	}
	err = obj.If(storage.Conditions{GenerationMatch: at.Generation}).Delete(w.ctx)
	if !errors.Is(err, storage.ErrObjectNotExist) {
		t.Fatalf("delete of an object that does not exist: %v, want 404", err)
	}
}

// TestReadPreconditions: a read through the XML API (the Go client's
// downloads) honours x-goog-if-generation-match.
func TestReadPreconditions(t *testing.T) {
	w := start(t)
	obj := w.client(t, "a").Bucket(bucket).Object("doc")
	at := w.put(t, obj, "v1")
	_, err := obj.If(storage.Conditions{GenerationMatch: at.Generation + 1}).NewReader(w.ctx)
	if err == nil || !strings.Contains(err.Error(), "412") {
		t.Fatalf("download at another generation: %v, want 412", err)
	}
	if got := read(t, w.ctx, obj.If(storage.Conditions{GenerationMatch: at.Generation})); got != "v1" {
		t.Fatalf("download at the current generation: %q", got)
	}
}

// TestHead: a HEAD of an object passes back the service's headers, with the
// object's length and true metageneration.
func TestHead(t *testing.T) {
	w := start(t)
	obj := w.client(t, "a").Bucket(bucket).Object("doc")
	w.put(t, obj, "four")
	if _, err := obj.Update(w.ctx, storage.ObjectAttrsToUpdate{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(w.ctx, http.MethodHead, "http://"+w.doors["a"]+"/storage/v1/b/"+bucket+"/o/doc", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != 4 || resp.Header.Get("X-Goog-Metageneration") != "2" {
		t.Fatalf("HEAD: %d, length %d, metageneration %q; want 200, 4, 2", resp.StatusCode, resp.ContentLength, resp.Header.Get("X-Goog-Metageneration"))
	}
}
