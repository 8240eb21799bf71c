package subscriber

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/raydrop/raydrop/pkg/ceserve"
	"github.com/raydrop/raydrop/pkg/gcstest"
)

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr []string
	}{
		{"bucket only", map[string]string{"SUBSCRIBER_BUCKET": "team-models"}, Config{Bucket: "team-models", Prefix: "models"}, nil},
		{"prefix", map[string]string{"SUBSCRIBER_BUCKET": "b", "SUBSCRIBER_PREFIX": "/adapters/prod/"}, Config{Bucket: "b", Prefix: "adapters/prod"}, nil},
		{"bucket top", map[string]string{"SUBSCRIBER_BUCKET": "b", "SUBSCRIBER_PREFIX": "/"}, Config{Bucket: "b", Prefix: ""}, nil},
		{"nothing", nil, Config{}, []string{"SUBSCRIBER_BUCKET is not set"}},
		{"every problem at once", map[string]string{"SUBSCRIBER_BUCKET": "gs://b/models", "SUBSCRIBER_PREFIX": "a/../b"},
			Config{}, []string{`SUBSCRIBER_BUCKET "gs://b/models" is not a bucket name`, `SUBSCRIBER_PREFIX "a/../b" is not a folder`}},
		{"empty segment", map[string]string{"SUBSCRIBER_BUCKET": "b", "SUBSCRIBER_PREFIX": "a//b"}, Config{}, []string{`SUBSCRIBER_PREFIX "a//b"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadConfig(func(k string) string { return tc.env[k] })
			if len(tc.wantErr) == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("LoadConfig = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("LoadConfig = %+v, want an error", got)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The entry point's HTTP handler (ceserve.Handler, as wire.go registers
// it), given the binary-mode request Eventarc posts: a promotion and a malformed event are acknowledged (2xx); a
// transient failure is not, so the push subscription delivers it again.
func TestHTTPReplies(t *testing.T) {
	w := newFakeWorld(t)
	best := w.checkpoint("r1", 20, 0.5)
	e := published(t, raydropEvent(t, succeeded("r1", t0, best)))
	unconfigured := newWorld(t, gcstest.New(t, checkpointBucket))
	unconfigured.checkpoint("r1", 20, 0.5)

	if code := post(t, w.h, e); code < 200 || code > 299 {
		t.Errorf("promotion: HTTP %d, want 2xx", code)
	}
	w.assertLatest("r1", best)
	if code := post(t, w.h, envelope(t, map[string]string{"origin": "elsewhere"}, []byte("hello"))); code < 200 || code > 299 {
		t.Errorf("malformed event: HTTP %d, want 2xx", code)
	}
	if code := post(t, unconfigured.h, e); code < 500 {
		t.Errorf("transient failure: HTTP %d, want 5xx", code)
	}
}

func post(t *testing.T, h *Handler, e event.Event) int {
	t.Helper()
	ctx := context.Background()
	recv := ceserve.Handler(h.Handle) // as the entry point is registered
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&e), req); err != nil {
		t.Fatal(err)
	}
	if req.Header.Get("Ce-Type") != PubSubPublished {
		t.Fatalf("not a binary-mode request: %v", req.Header)
	}
	rec := httptest.NewRecorder()
	recv.ServeHTTP(rec, req)
	return rec.Code
}
