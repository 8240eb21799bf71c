package faults

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func newProxy(t *testing.T) (*Proxy, string, *int) {
	t.Helper()
	hits := 0
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	t.Cleanup(svc.Close)
	p, err := New("svc", svc.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	addr, err := p.Door("fn")
	if err != nil {
		t.Fatal(err)
	}
	return p, "http://" + addr, &hits
}

func do(t *testing.T, method, url string) (int, string, error) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestForwardsAndRecords(t *testing.T) {
	p, base, hits := newProxy(t)
	var hooked []Request
	p.SetHook(func(r Request) { hooked = append(hooked, r) })
	code, body, err := do(t, http.MethodPut, base+"/a/b")
	if err != nil || code != 200 || body != "PUT /a/b" || *hits != 1 {
		t.Fatalf("code %d body %q err %v hits %d", code, body, err, *hits)
	}
	got := p.Requests()
	if len(got) != 1 || got[0].Client != "fn" || !got[0].Write || got[0].Status != 200 || got[0].Injected {
		t.Fatalf("recorded %+v", got)
	}
	if len(hooked) != 1 || hooked[0].Path != "/a/b" {
		t.Fatalf("hook saw %+v", hooked)
	}
}

func TestConflictShare(t *testing.T) {
	p, base, hits := newProxy(t)
	p.SetConflictShare(1)
	code, body, err := do(t, http.MethodPost, base+"/apis/x/v1/namespaces/default/things")
	if err != nil || code != http.StatusConflict || !strings.Contains(body, `"reason":"Conflict"`) || *hits != 0 {
		t.Fatalf("code %d body %q err %v hits %d", code, body, err, *hits)
	}
	if code, _, _ := do(t, http.MethodGet, base+"/x"); code != 200 {
		t.Errorf("a read got %d: only writes get conflicts", code)
	}
	p.SetConflictShare(0)
	if code, _, _ := do(t, http.MethodPost, base+"/x"); code != 200 {
		t.Errorf("share 0: write got %d", code)
	}
	if r := p.Requests(); len(r) != 3 || !r[0].Injected || r[1].Injected {
		t.Errorf("recorded %+v", r)
	}
}

func TestDownAndUp(t *testing.T) {
	p, base, _ := newProxy(t)
	p.Down()
	if _, _, err := do(t, http.MethodGet, base+"/x"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("while down: err %v, want connection refused", err)
	}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	if code, _, err := do(t, http.MethodGet, base+"/x"); err != nil || code != 200 {
		t.Fatalf("after up: %d %v", code, err)
	}
}

// TestGate: a gate answers what it refuses (recorded as injected, the
// service untouched) and forwards the rest, whose answer it may edit.
func TestGate(t *testing.T) {
	p, door, hits := newProxy(t)
	p.SetGate(func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusPreconditionFailed)
			return
		}
		w.Header().Set("X-Gate", "seen")
		forward.ServeHTTP(w, r)
	})
	if status, _, err := do(t, http.MethodDelete, door+"/x"); err != nil || status != http.StatusPreconditionFailed {
		t.Fatalf("refused delete: %d %v", status, err)
	}
	if status, body, err := do(t, http.MethodGet, door+"/x"); err != nil || status != http.StatusOK || body != "GET /x" {
		t.Fatalf("forwarded get: %d %q %v", status, body, err)
	}
	if *hits != 1 {
		t.Fatalf("service hit %d times, want 1", *hits)
	}
	reqs := p.Requests()
	if len(reqs) != 2 || !reqs[0].Injected || reqs[0].Status != http.StatusPreconditionFailed || reqs[1].Injected || reqs[1].Status != http.StatusOK {
		t.Fatalf("recorded %+v", reqs)
	}
}
