package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/examples/subscriber"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestExampleSubscriber: the example subscriber, deployed with a trigger on
// the events topic as a downstream team would, promotes the best adapter
// of a run that succeeded into models/<name>/latest/ with its manifest; the
// same event published again, and an older run's event, change nothing.
func TestExampleSubscriber(t *testing.T) {
	t.Parallel()
	const model = "e2e-subscriber-model"
	runID := upload(t, "subscriber", specFor(t, "e2e-subscriber", map[string]any{"name": model}), "steps=3,step=200ms")
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("run ended %s: %s", r.Phase, r.Message)
	}
	evs := eventsOf(t, runID)
	final := terminalOf(t, evs).Run
	best := final.BestCheckpoint
	latest := "models/" + model + "/latest/"
	models := st.GCS.Bucket(stack.ModelsBucket)

	ctx := context.Background()
	var m subscriber.Manifest
	deadline := time.Now().Add(60 * time.Second)
	for m.RunID != runID {
		if time.Now().After(deadline) {
			t.Fatalf("no manifest of run %s in gs://%s/%s within 60 s (have %+v; log %s)", runID, stack.ModelsBucket, latest, m, st.SubscriberLog())
		}
		time.Sleep(300 * time.Millisecond)
		if b, err := read(ctx, models.Object(latest+subscriber.ManifestFile)); err == nil {
			m = subscriber.Manifest{}
			_ = json.Unmarshal(b, &m)
		}
	}
	if m.CheckpointURI != best.URI || m.Step != best.Step || m.BestBy != "eval_loss" || m.Metrics["eval_loss"] != best.Metrics["eval_loss"] || m.EventID != runID+"/succeeded" {
		t.Errorf("manifest %+v, want the best checkpoint %+v chosen by eval_loss", m, best)
	}
	bucket, dir, _ := strings.Cut(strings.TrimPrefix(best.URI, "gs://"), "/")
	for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
		want, err := read(ctx, st.GCS.Bucket(bucket).Object(dir+"/"+f))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := read(ctx, models.Object(latest+f)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("promoted %s: %d bytes (%v), want the checkpoint's %d", f, len(got), err, len(want))
		}
	}
	gens := generations(t, models, latest)

	// The same event again, as a redelivery would bring it, then an event
	// of a run that ended an hour earlier with the same checkpoints.
	older := final
	older.RunID = "e2e-subscriber-older"
	end := final.EndedAt.Add(-time.Hour)
	older.EndedAt = &end
	for _, d := range []events.Run{final, older} {
		e, err := events.New("//raydrop.dev/localcloud", d, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pub := st.PS.Publisher(stack.Topics.Events)
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: e.Data(), Attributes: events.PubSubAttributes(e)}).Get(ctx); err != nil {
			t.Fatal(err)
		}
		pub.Stop()
	}
	waitLog(t, `"message":"duplicate_ignored"`, runID)
	waitLog(t, `"message":"older_run_ignored"`, older.RunID)
	if after := generations(t, models, latest); !maps.Equal(after, gens) {
		t.Errorf("latest/ changed: %v, was %v", after, gens)
	}
}

func read(ctx context.Context, o *storage.ObjectHandle) ([]byte, error) {
	rd, err := o.NewReader(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rd.Close() }()
	return io.ReadAll(rd)
}

// generations maps every object under prefix to its generation.
func generations(t *testing.T, b *storage.BucketHandle, prefix string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, a := range objects(t, b, prefix) {
		out[a.Name] = a.Generation
	}
	return out
}

// objects lists the objects under prefix.
func objects(t *testing.T, b *storage.BucketHandle, prefix string) []*storage.ObjectAttrs {
	t.Helper()
	var out []*storage.ObjectAttrs
	it := b.Objects(context.Background(), &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
}

// waitLog waits until the subscriber logged a line with message about runID.
func waitLog(t *testing.T, message, runID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(st.SubscriberLog())
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, message) && strings.Contains(l, `"run_id":"`+runID+`"`) {
				return
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("the subscriber did not log %s for run %s within 60 s (%s)", message, runID, st.SubscriberLog())
}
