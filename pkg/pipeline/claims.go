package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
)

// The claim-and-announce machinery: every public event goes out once per
// phase the run entered, in the order it entered them, although every
// delivery may be repeated, run concurrently with another, or die anywhere.
// A delivery claims an event in the record (compare-and-swap) before it
// publishes it, and records it published after.

// Recovery after a crash. Every hop is delivered at least once, but a
// delivery whose instance died may not come back soon, or at all (its
// message can run out of delivery attempts), so the monitor's sweep is what
// bounds recovery, and these constants fix the bound (runs.RecoveryBound):
//
//   - A delivery claims a public event before publishing it (Announce). The
//     claim holds the others off for ClaimFor; the claimer publishes under a
//     deadline of publishWithin, so a live claimer has published, or given
//     its claim up, by then. Only a claimer that died leaves a claim behind,
//     and it expires ClaimFor after it was taken.
//   - A step whose record has not changed for runs.StaleStep (a run ACCEPTED but
//     never admitted, PROVISIONED never submitted, FINISHING never
//     finalized, or ended but never announced) is driven on by the next
//     sweep: it re-admits the run or resends the step's message. StaleStep
//     is longer than ClaimFor, so a claim left by the dead delivery has
//     expired when the step is retried. SUBMITTED and RUNNING runs are
//     checked on every tick.
//   - The sweep runs on every scheduler tick.
const (
	ClaimFor      = 10 * time.Second
	publishWithin = 5 * time.Second
)

// HolderWithoutRecord is how long a cluster's lease may name a run that
// has no record before the sweep takes the lease back: a new run takes its
// cluster before its record is created, so a holder without a record may
// be a delivery at work. This is longer than a delivery can last (the
// functions' timeout, timeout_seconds in infra/gcp/functions.tf); only a
// delivery that died and was never redelivered leaves such a lease.
const HolderWithoutRecord = 10 * time.Minute

// errClaimed means another delivery is publishing this event right now.
var errClaimed = errors.New("another delivery is publishing this event")

// claim takes, in the record being written, the right to publish the event
// of phase p: false when it has gone out or another delivery holds a fresh
// claim to it. The claim holds the others off for ClaimFor.
func claim(r *runs.Record, p runs.Phase, now time.Time) bool {
	if r.WasPublished(p) {
		return false
	}
	if t, ok := r.Publishing[p]; ok && now.Sub(t) < ClaimFor {
		return false
	}
	if r.Publishing == nil {
		r.Publishing = map[runs.Phase]time.Time{}
	}
	r.Publishing[p] = now
	return true
}

// ClaimPending claims, in the record being written, the events of the
// phases the run has entered whose event has not gone out, in order
// (ClaimOwed), unless the run has ended: finalize announces what an ended
// run still owes, once the cluster is released.
func ClaimPending(r *runs.Record, now time.Time) []runs.Phase {
	if r.Phase.Terminal() {
		return nil
	}
	claimed, _ := ClaimOwed(r, now)
	return claimed
}

// ClaimOwed claims, in the record being written, the events the run owes:
// those of the phases it entered whose event has not gone out, in order
// (an ended run's terminal one last). It stops before one that another
// delivery holds a fresh claim to (held), so that no event goes out before
// one of a phase the run entered earlier.
func ClaimOwed(r *runs.Record, now time.Time) (claimed []runs.Phase, held bool) {
	for _, e := range r.History {
		if e.Phase.Event() == "" || slices.Contains(claimed, e.Phase) || r.WasPublished(e.Phase) {
			continue
		}
		if !claim(r, e.Phase, now) {
			return claimed, true
		}
		claimed = append(claimed, e.Phase)
	}
	return claimed, false
}

// PublishClaimed publishes the events of phases, which this delivery
// claimed in rec at claimedAt, in order, and records them published. Work
// done since the claim (releasing a cluster) may have taken most of
// ClaimFor: then it renews the claims first, so that no other delivery
// publishes them meanwhile. It returns the record as last written.
func (d *Deps) PublishClaimed(ctx context.Context, rec *runs.Record, phases []runs.Phase, claimedAt time.Time) (*runs.Record, error) {
	if len(phases) == 0 {
		return rec, nil
	}
	if now := d.Time(); now.Sub(claimedAt) > ClaimFor-publishWithin {
		var err error
		rec, err = d.Runs.Update(ctx, rec.RunID, func(cur *runs.Record) error {
			for _, p := range phases {
				if t, ok := cur.Publishing[p]; !ok || !t.Equal(claimedAt) {
					return fmt.Errorf("run %s, %s event: %w", cur.RunID, p.Event(), errClaimed)
				}
				cur.Publishing[p] = now
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		claimedAt = now
	}
	if err := d.Publish(ctx, rec, phases, claimedAt); err != nil {
		return nil, err
	}
	return d.MarkPublished(ctx, rec.RunID, phases)
}

// Advance changes the run's record with fn and, in the same write, claims
// its pending events (ClaimPending); then it publishes them, in order, and
// records them published. Folding the claim into the transition saves a
// write of the record, which Cloud Storage allows about once a second.
// fn may refuse with runs.ErrNoChange: the events are still claimed and
// published. It returns the record as last written.
func (d *Deps) Advance(ctx context.Context, runID string, fn func(*runs.Record) error) (*runs.Record, error) {
	now := d.Time()
	var claimed []runs.Phase
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		err := fn(r)
		if err != nil && !errors.Is(err, runs.ErrNoChange) {
			return err
		}
		claimed = ClaimPending(r, now)
		if len(claimed) == 0 {
			return err
		}
		return nil
	})
	if err != nil {
		return rec, err
	}
	return d.PublishClaimed(ctx, rec, claimed, now)
}

// Announce publishes the public event of phase for the record once. A
// delivery first claims the event in the record (compare-and-swap), so
// concurrent deliveries never both publish; it marks the event published
// after Pub/Sub took it. Only a delivery that dies between the two leaves a
// stale claim, and the next one then publishes again under the same
// CloudEvent ID, which subscribers can use to drop the copy.
func (d *Deps) Announce(ctx context.Context, r *runs.Record, p runs.Phase) (*runs.Record, error) {
	if p.Event() == "" {
		return nil, Permanent(fmt.Errorf("phase %s has no public event", p))
	}
	if r.WasPublished(p) {
		return r, nil
	}
	now := d.Time()
	r, err := d.Runs.Update(ctx, r.RunID, func(cur *runs.Record) error {
		if cur.WasPublished(p) {
			return runs.ErrNoChange
		}
		if !claim(cur, p, now) {
			return errClaimed
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("announce %s of run: %w", p.Event(), err)
	}
	if r.WasPublished(p) {
		return r, nil
	}
	return d.PublishClaimed(ctx, r, []runs.Phase{p}, now)
}

// AnnounceReport records the run's report, written at uri, and announces it
// (report_ready) once: the record and the event's claim in one write, then
// the event, then the record of it published. Call it once the terminal
// event has gone out (the report's event never precedes it). A claim
// another delivery holds is an error: try again later, in case it dies
// before it has published.
func (d *Deps) AnnounceReport(ctx context.Context, runID, uri string) (*runs.Record, error) {
	now := d.Time()
	claimed := false
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		claimed = false
		if !r.WasPublished(r.Phase) || !r.Phase.Terminal() {
			return Permanent(fmt.Errorf("run %s is %s, its terminal event not out: its report is announced after it", r.RunID, r.Phase))
		}
		changed := r.Report == ""
		if changed {
			r.Report = uri
		}
		claimed = claim(r, runs.ReportReady, now)
		if !claimed && !changed {
			return runs.ErrNoChange
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("announce the report: %w", err)
	}
	if claimed {
		return d.PublishClaimed(ctx, rec, []runs.Phase{runs.ReportReady}, now)
	}
	if !rec.WasPublished(runs.ReportReady) {
		return rec, fmt.Errorf("run %s, %s event: %w", runID, runs.ReportReady.Event(), errClaimed)
	}
	return rec, nil
}

// Publish publishes the events of phases, which this delivery claimed in
// rec at now, in order, all within publishWithin of each other. If one
// fails, the claims of those not published are given up at once, so a
// redelivery publishes them without waiting for the claims to expire.
// Then the deployment's message bus gets them (toBus), off the topic's
// deadline: a bus that is down or slow costs the run busWithin at most.
func (d *Deps) Publish(ctx context.Context, rec *runs.Record, phases []runs.Phase, now time.Time) error {
	pctx, cancel := context.WithTimeout(ctx, publishWithin)
	defer cancel()
	sent := make([]cloudevents.Event, 0, len(phases))
	for i, p := range phases {
		e, err := events.New(d.Config.EventSource, events.Data(rec, p, d.Config.GPUHourUSD), now)
		if err == nil {
			err = d.Publisher.Publish(pctx, d.Config.Topics.Events, e.Data(), events.PubSubAttributes(e))
		}
		if err != nil {
			// The claims of those not published are given up at once.
			_, _ = d.settle(ctx, rec.RunID, phases[:i], phases[i:])
			return fmt.Errorf("publish %s event of run %s: %w", p.Event(), rec.RunID, err)
		}
		d.Log.Info("event_published", "run_id", rec.RunID, "type", e.Type())
		sent = append(sent, e)
	}
	for _, e := range sent {
		if err := d.toBus(ctx, rec.RunID, e); err != nil {
			// Not on the bus and not written down: publish them all again
			// (the topic's subscribers drop the copies by CloudEvent ID).
			_, _ = d.settle(ctx, rec.RunID, nil, phases)
			return err
		}
	}
	return nil
}

// MarkPublished records that the events of phases have gone out.
func (d *Deps) MarkPublished(ctx context.Context, runID string, phases []runs.Phase) (*runs.Record, error) {
	return d.settle(ctx, runID, phases, nil)
}

// settle ends this delivery's claims in one write: the events of published
// have gone out, those of released may be published by anyone.
// A settlement another delivery has already recorded (the next step
// records what the message that started it says went out) writes nothing.
func (d *Deps) settle(ctx context.Context, runID string, published, released []runs.Phase) (*runs.Record, error) {
	return d.Runs.Update(ctx, runID, func(cur *runs.Record) error {
		recorded := RecordPublished(cur, published)
		if released := release(cur, released); !recorded && !released {
			return runs.ErrNoChange
		}
		return nil
	})
}

// RecordPublished records, in the record being written, that the events of
// phases have gone out, ending their claims; it reports whether that
// changed the record.
func RecordPublished(r *runs.Record, phases []runs.Phase) bool {
	changed := false
	for _, p := range phases {
		if _, claimed := r.Publishing[p]; claimed || !r.WasPublished(p) {
			r.MarkPublished(p)
			delete(r.Publishing, p)
			changed = true
		}
	}
	return changed
}

// release gives up, in the record being written, the claims of phases.
func release(r *runs.Record, phases []runs.Phase) bool {
	changed := false
	for _, p := range phases {
		if _, ok := r.Publishing[p]; ok {
			delete(r.Publishing, p)
			changed = true
		}
	}
	return changed
}
