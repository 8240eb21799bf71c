package ceserve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

type idKey struct{}

// post sends a binary-mode CloudEvent with id, under timeout, through c.
func post(c *http.Client, url, id string, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"n":1}`))
	req.Header.Set("ce-specversion", "1.0")
	req.Header.Set("ce-id", id)
	req.Header.Set("ce-type", "dev.raydrop.test")
	req.Header.Set("ce-source", "//test")
	req.Header.Set("content-type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestEachRequestKeepsItsEventAndContext: many deliveries at once, half of
// them given up by the sender within milliseconds (as a push past its
// deadline is): every handler runs with its own request's context and
// event, and no delivery waits for another to come. (The SDK's receive
// handler, which functions.CloudEvent uses, failed 12 of the 1,000 kept
// deliveries of this load, and the server could not shut down after.)
func TestEachRequestKeepsItsEventAndContext(t *testing.T) {
	var mismatched, handled atomic.Int32
	h := Handler(func(ctx context.Context, e event.Event) error {
		if ctx.Value(idKey{}) != e.ID() {
			mismatched.Add(1)
		}
		if strings.HasPrefix(e.ID(), "fast-") {
			handled.Add(1)
		}
		if strings.HasPrefix(e.ID(), "slow-") {
			<-ctx.Done() // held until its sender gives up
			return ctx.Err()
		}
		return nil
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r.WithContext(context.WithValue(r.Context(), idKey{}, r.Header.Get("ce-id"))))
	}))
	defer srv.Close()

	// The senders that give up use connections of their own: the client's
	// transport may hand a connection being dialled for a request that was
	// given up to another waiting request, with the first one's error,
	// which would fail a kept delivery for a reason outside the server.
	giveUp := &http.Client{Transport: &http.Transport{}}
	defer giveUp.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 2000)
	for i := range 2000 {
		wg.Go(func() {
			if i%2 == 0 {
				_, _ = post(giveUp, srv.URL, fmt.Sprintf("slow-%d", i), time.Duration(i%7)*time.Millisecond)
				return
			}
			// A kept delivery has a minute: a handler that waited for
			// another would hold it forever, and under the race detector
			// on a busy machine 1,000 connections take seconds to dial.
			start := time.Now()
			code, err := post(http.DefaultClient, srv.URL, fmt.Sprintf("fast-%d", i), time.Minute)
			if err != nil || code != http.StatusNoContent {
				errs <- fmt.Errorf("delivery %d: %d after %v: %w", i, code, time.Since(start), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := mismatched.Load(); n != 0 {
		t.Errorf("%d handlers ran with another request's context", n)
	}
	if n := handled.Load(); n != 1000 {
		t.Errorf("%d of the 1,000 deliveries not given up handled", n)
	}
}

func TestAnswers(t *testing.T) {
	failing := errors.New("transient")
	srv := httptest.NewServer(Handler(func(_ context.Context, e event.Event) error {
		if e.ID() == "fail" {
			return failing
		}
		return nil
	}))
	defer srv.Close()
	if code, err := post(http.DefaultClient, srv.URL, "ok", time.Second); err != nil || code != http.StatusNoContent {
		t.Errorf("success: %d %v", code, err)
	}
	if code, err := post(http.DefaultClient, srv.URL, "fail", time.Second); err != nil || code != http.StatusInternalServerError {
		t.Errorf("handler error: %d %v, want 500 (redelivered)", code, err)
	}
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no CloudEvent: %v %v, want 400", resp, err)
	}
	if resp != nil {
		_ = resp.Body.Close()
	}
}
