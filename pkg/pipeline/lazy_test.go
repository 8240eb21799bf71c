package pipeline

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestLazyKeepsOnlySuccess: a build that failed (GKE or credentials not
// ready yet) is tried again on the next event, and the instance serves
// from then on; a configuration error is kept, as no retry can fix it.
func TestLazyKeepsOnlySuccess(t *testing.T) {
	ctx := context.Background()
	builds := 0
	fails := 1
	l := &Lazy{Build: func(context.Context) (*Deps, error) {
		builds++
		if builds <= fails {
			return nil, errors.New("get GKE cluster: permission denied (IAM still propagating)")
		}
		return &Deps{}, nil
	}}
	if _, err := l.Get(ctx); err == nil {
		t.Fatal("first build failed, Get did not say so")
	}
	d1, err := l.Get(ctx)
	if err != nil {
		t.Fatalf("second event: %v; the instance stayed broken", err)
	}
	if d2, _ := l.Get(ctx); d2 != d1 || builds != 2 {
		t.Errorf("built %d times, same deps %v; want 2 builds and the built deps kept", builds, d2 == d1)
	}

	builds = 0
	l = &Lazy{Build: func(context.Context) (*Deps, error) {
		builds++
		return nil, fmt.Errorf("%w: RAYDROP_PROJECT is not set", ErrConfiguration)
	}}
	for range 3 {
		if _, err := l.Get(ctx); !errors.Is(err, ErrConfiguration) {
			t.Fatalf("configuration error: %v", err)
		}
	}
	if builds != 1 {
		t.Errorf("a configuration error was built %d times, want 1", builds)
	}
}

// TestServeRebuildsAfterCredentialFailure: after the API server refuses
// the client's credentials, the next event builds fresh clients; other
// failures keep them.
func TestServeRebuildsAfterCredentialFailure(t *testing.T) {
	builds := 0
	l := &Lazy{Build: func(context.Context) (*Deps, error) {
		builds++
		return &Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil
	}}
	gr := schema.GroupResource{Group: "ray.io", Resource: "rayjobs"}
	for i, c := range []struct {
		err        error
		wantBuilds int
	}{
		{nil, 1},
		{apierrors.NewConflict(gr, "x", errors.New("conflict")), 1},
		{fmt.Errorf("get rayjob: %w", apierrors.NewUnauthorized("token expired")), 1},
		{nil, 2}, // rebuilt
		{fmt.Errorf("dial: %w", &tlsVerifyError), 2},
		{nil, 3},
	} {
		_ = Serve(context.Background(), "test", l, func(context.Context, *Deps) error { return c.err })
		if builds != c.wantBuilds {
			t.Errorf("step %d (%v): %d builds, want %d", i, c.err, builds, c.wantBuilds)
		}
	}
}

var tlsVerifyError = tls.CertificateVerificationError{Err: errors.New("x509: certificate signed by unknown authority")}
