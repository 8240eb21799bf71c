package faults

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestLimitWrites: a second successful write of one resource within the
// interval is refused with 429, from any client; a failed write does not
// count, other resources and reads are not limited, and after the interval
// the resource may be written again.
func TestLimitWrites(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/fail") {
			w.WriteHeader(http.StatusPreconditionFailed)
		}
	}))
	defer srv.Close()
	p, err := New("svc", srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const every = 300 * time.Millisecond
	p.LimitWrites(every, func(_, path string) string { return strings.TrimSuffix(path, "/fail") }, func(k string) string { return "slow down " + k })
	a, _ := p.Door("a")
	b, _ := p.Door("b")
	send := func(door, method, path string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+door+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	steps := []struct {
		door, method, path string
		want               int
	}{
		{a, "PUT", "/x/fail", http.StatusPreconditionFailed}, // failed: not counted
		{a, "PUT", "/x", http.StatusOK},
		{b, "PUT", "/x", http.StatusTooManyRequests}, // another client, same object
		{a, "PUT", "/x/fail", http.StatusTooManyRequests},
		{a, "GET", "/x", http.StatusOK},
		{b, "PUT", "/y", http.StatusOK},
	}
	for i, s := range steps {
		if got := send(s.door, s.method, s.path); got != s.want {
			t.Errorf("step %d %s %s: %d, want %d", i, s.method, s.path, got, s.want)
		}
	}
	time.Sleep(every)
	if got := send(b, "PUT", "/x"); got != http.StatusOK {
		t.Errorf("write after the interval: %d, want 200", got)
	}
	refused := 0
	for _, r := range p.Requests() {
		if r.Injected && r.Status == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("%d refusals recorded, want 2", refused)
	}
}
