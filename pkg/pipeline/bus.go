package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
)

// An Eventarc Advanced message bus receives every public event too, when
// the deployment names one (RAYDROP_EVENT_BUS), so that enrollments can
// route raydrop's events by type and subject with CEL. The bus gets the
// same CloudEvent as the topic (type, id, source, subject, time, data) in
// the JSON event format, through the publishing API:
// https://cloud.google.com/eventarc/advanced/docs/publish-events/publish-events-direct-format
//
// The bus never holds a run back and never loses an event. The delivery
// that claimed an event (Announce) publishes it to the topic, then to the
// bus under a short deadline of its own (busWithin); if the bus does not
// take it, the event is written down as owed (owed/<run>/<phase>.json in
// the state bucket, with its JSON) and the run goes on. Every sweep retries
// the owed events: it claims one by writing it again under a generation
// precondition, so two sweeps never publish it both, publishes it and
// deletes it. Only a sweep that dies between the publish
// and the delete leaves a copy to be published again, under the same
// CloudEvent ID, as on the topic.

// Bus publishes events to an Eventarc Advanced message bus.
type Bus interface {
	// Publish publishes one CloudEvent in the JSON event format.
	Publish(ctx context.Context, bus, json string) error
}

// busWithin bounds one publish to the bus in the delivery that claimed the
// event: a bus that does not answer by then is retried by the sweep.
const busWithin = 2 * time.Second

// owedPrefix holds the events the bus has not taken yet, in the state
// bucket.
const owedPrefix = "owed/"

// claimKey is the owed event's metadata that claims it for one sweep.
const claimKey = "raydrop-claimed-at"

// toBus publishes e to the deployment's bus, if it has one; an event the
// bus does not take is written down as owed for the sweep. Only when that
// write fails too does it return an error, so that the event is published
// again rather than lost.
func (d *Deps) toBus(ctx context.Context, runID string, e cloudevents.Event) error {
	if d.Bus == nil || d.Config.EventBus == "" {
		return nil
	}
	json, err := e.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode %s event of run %s for the bus: %w", e.Type(), runID, err)
	}
	bctx, cancel := context.WithTimeout(ctx, busWithin)
	err = d.Bus.Publish(bctx, d.Config.EventBus, string(json))
	cancel()
	if err == nil {
		d.Log.Info("bus_event_published", "run_id", runID, "type", e.Type())
		return nil
	}
	d.Log.Warn("bus_event_owed", "run_id", runID, "type", e.Type(), "error", err.Error())
	if werr := d.owe(ctx, runID, e.Type(), json); werr != nil {
		return fmt.Errorf("bus refused the %s event of run %s (%w) and it could not be written down: %w", e.Type(), runID, err, werr)
	}
	return nil
}

func owedName(runID, typ string) string {
	return owedPrefix + runID + "/" + strings.TrimPrefix(typ, "dev.raydrop.run.v1.") + ".json"
}

// owe writes an event the bus has not taken into the state bucket, once.
func (d *Deps) owe(ctx context.Context, runID, typ string, json []byte) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	w := d.StateBucket.Object(owedName(runID, typ)).If(storage.Conditions{DoesNotExist: true}).NewWriter(ctx)
	w.ContentType = "application/cloudevents+json"
	w.ChunkSize = 0
	if _, err := w.Write(json); err != nil {
		_ = w.Close()
		return err
	}
	if err := w.Close(); err != nil && !gcsdoc.IsPrecondition(err) {
		return err
	}
	return nil
}

// RetryBus publishes the events the bus owes, each claimed by one sweep. It
// returns how many went out and how many are still owed.
func (d *Deps) RetryBus(ctx context.Context) (published, owed int, err error) {
	if d.Bus == nil || d.Config.EventBus == "" || d.StateBucket == nil {
		return 0, 0, nil
	}
	// The list first: publishing takes a while, and the listing's deadline
	// is its own.
	lctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	var due []*storage.ObjectAttrs
	it := d.StateBucket.Objects(lctx, &storage.Query{Prefix: owedPrefix})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("list owed bus events: %w", err)
		}
		due = append(due, a)
	}
	var errs []error
	for _, a := range due {
		ok, err := d.retryOne(ctx, a)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			published++
		} else {
			owed++
		}
	}
	return published, owed, errors.Join(errs...)
}

// retryOne claims one owed event, publishes it and deletes it. The claim
// writes the event again over the generation listed (ifGenerationMatch),
// with the claim's time in its metadata: of two sweeps, one claims and the
// other gets 412 (or finds the listed generation gone). Publishing done, it
// deletes exactly the generation it wrote, so a later claim by another
// sweep (after ClaimFor) survives.
func (d *Deps) retryOne(ctx context.Context, a *storage.ObjectAttrs) (bool, error) {
	now := d.Time()
	if t, err := time.Parse(time.RFC3339Nano, a.Metadata[claimKey]); err == nil && now.Sub(t) < ClaimFor {
		return false, nil // another sweep is at it
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	o := d.StateBucket.Object(a.Name)
	rd, err := o.Generation(a.Generation).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return false, nil // claimed or done by another sweep since the listing
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", a.Name, err)
	}
	json, err := io.ReadAll(rd)
	_ = rd.Close()
	if err != nil {
		return false, fmt.Errorf("read %s: %w", a.Name, err)
	}
	w := o.If(storage.Conditions{GenerationMatch: a.Generation}).NewWriter(ctx)
	w.ContentType = a.ContentType
	w.Metadata = map[string]string{claimKey: now.Format(time.RFC3339Nano)}
	w.ChunkSize = 0
	if _, err := w.Write(json); err != nil {
		_ = w.Close()
		return false, fmt.Errorf("claim %s: %w", a.Name, err)
	}
	if err := w.Close(); err != nil {
		if gcsdoc.IsPrecondition(err) {
			return false, nil // claimed or done by another sweep
		}
		return false, fmt.Errorf("claim %s: %w", a.Name, err)
	}
	bctx, bcancel := context.WithTimeout(ctx, busWithin)
	err = d.Bus.Publish(bctx, d.Config.EventBus, string(json))
	bcancel()
	if err != nil {
		return false, fmt.Errorf("publish %s to the bus: %w", a.Name, err)
	}
	d.Log.Info("bus_event_published", "owed", a.Name)
	if err := o.Generation(w.Attrs().Generation).Delete(ctx); err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return true, fmt.Errorf("delete %s: %w", a.Name, err)
	}
	return true, nil
}
