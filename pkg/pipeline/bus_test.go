package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/gcstest"
)

// fakeBus records what it takes and refuses everything while down.
type fakeBus struct {
	mu    sync.Mutex
	down  bool
	got   []string
	tries int
}

func (b *fakeBus) Publish(_ context.Context, bus, json string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tries++
	if b.down {
		return errors.New("unavailable")
	}
	b.got = append(b.got, bus+" "+json)
	return nil
}

// TestBusOwedEventsAreRetriedOnce: an event the bus refuses is written
// down; a sweep retries it under a claim that holds other sweeps off for
// ClaimFor, and once the bus takes it, it is published once and forgotten.
func TestBusOwedEventsAreRetriedOnce(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	bus := &fakeBus{down: true}
	d := &Deps{
		Config:      config.Config{EventBus: "projects/my-project/locations/us-central1/messageBuses/b", EventSource: "//raydrop.dev/test"},
		Bus:         bus,
		StateBucket: gcstest.New(t, "state").Bucket("state"),
		Log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock:       func() time.Time { return now },
	}
	e, err := events.New(d.Config.EventSource, events.Run{RunID: "r1", Name: "n", Source: "s", Phase: "accepted"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.toBus(ctx, "r1", e); err != nil {
		t.Fatalf("a bus outage failed the publish: %v", err)
	}
	// The same event refused again (a redelivery) is owed once.
	if err := d.toBus(ctx, "r1", e); err != nil {
		t.Fatal(err)
	}
	if sent, owed, err := d.RetryBus(ctx); sent != 0 || owed != 1 || err == nil {
		t.Fatalf("retry while down: %d sent, %d owed, %v; want 0, 1 and the error", sent, owed, err)
	}
	bus.down = false
	tries := bus.tries
	if sent, owed, err := d.RetryBus(ctx); sent != 0 || owed != 1 || err != nil || bus.tries != tries {
		t.Fatalf("retry within the claim: %d sent, %d owed, %v, %d tries; want it left alone", sent, owed, err, bus.tries-tries)
	}
	now = now.Add(ClaimFor + time.Second)
	if sent, owed, err := d.RetryBus(ctx); sent != 1 || owed != 0 || err != nil {
		t.Fatalf("retry after the claim: %d sent, %d owed, %v; want 1, 0", sent, owed, err)
	}
	want, _ := e.MarshalJSON()
	if len(bus.got) != 1 || bus.got[0] != d.Config.EventBus+" "+string(want) {
		t.Fatalf("bus got %q, want the event once", bus.got)
	}
	now = now.Add(ClaimFor + time.Second)
	if sent, owed, err := d.RetryBus(ctx); sent != 0 || owed != 0 || err != nil || len(bus.got) != 1 {
		t.Fatalf("after it went out: %d sent, %d owed, %v, bus %d events", sent, owed, err, len(bus.got))
	}
}

func TestBusNameIsChecked(t *testing.T) {
	env := map[string]string{"RAYDROP_PROJECT": "p", "RAYDROP_INTAKE_BUCKET": "i", "RAYDROP_OUTPUT_BUCKETS": "o", "RAYDROP_KUBECONFIG": "k"}
	for bus, ok := range map[string]bool{
		"": true, "projects/my-project/locations/us-central1/messageBuses/raydrop": true,
		"raydrop": false, "projects/my-project/messageBuses/raydrop": false,
	} {
		env["RAYDROP_EVENT_BUS"] = bus
		_, err := config.LoadConfig(func(k string) string { return env[k] })
		if (err == nil) != ok {
			t.Errorf("RAYDROP_EVENT_BUS %q: %v", bus, err)
		}
	}
}
