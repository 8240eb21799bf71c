package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
)

// AdmitNew admits a new run (a spec from the intake, or a sweep's trial) with two writes of its record, the least Cloud
// Storage's rate of one write per second to an object makes slow: it takes
// the cluster (or queues) first, then creates the record already
// PROVISIONED (or QUEUED), holding the claims to its events (accepted, and
// queued), publishes them, sends the provisioned message, and records the
// events published. Everything before the record exists is idempotent,
// keyed by the run ID: a delivery that dies there leaves a lease or a
// waiting object a redelivery finds as its own (and the sweep releases a
// lease whose holder has no record). One that dies after leaves the record
// for the redelivery (resume) or the sweep.
func (d *Deps) AdmitNew(ctx context.Context, rec *runs.Record) error {
	now := d.Time()
	holder := ""
	var start *Start
	if rec.Phase == runs.Accepted {
		lease, err := d.Leases.Acquire(ctx, rec.Namespace, rec.Cluster, rec.RunID)
		if err != nil {
			return err
		}
		if lease.Holder == rec.RunID {
			// The data check first when the spec asks for it (on the head:
			// no worker is asked for yet), else the first attempt.
			s, perr := d.Prepare(ctx, rec, FirstAttempt(rec), "", "")
			if perr != nil {
				return perr
			}
			start, err = &s, s.Mark(rec, now)
		} else {
			holder = lease.Holder
			err = rec.MarkQueued(holder, now)
		}
		if err != nil {
			return Permanent(err) // a new record is ACCEPTED: cannot happen
		}
	}
	claimed := ClaimPending(rec, now)
	if rec.Phase == runs.Rejected { // terminal: ClaimPending leaves it
		rec.Publishing = map[runs.Phase]time.Time{runs.Rejected: now}
		claimed = []runs.Phase{runs.Rejected}
	}
	if err := d.Runs.Create(ctx, rec); errors.Is(err, runs.ErrExists) {
		// A concurrent delivery created it first: carry on from its record.
		if rec, err = d.Runs.Get(ctx, rec.RunID); err != nil {
			return err
		}
		return d.Resume(ctx, rec)
	} else if err != nil {
		return err
	}
	switch rec.Phase {
	case runs.Rejected:
		d.Log.Warn("spec_rejected", "run_id", rec.RunID, "source", rec.Source, "problems", len(rec.Problems), "message", rec.Message)
	case runs.Queued:
		d.Log.Info("run_accepted", "run_id", rec.RunID, "source", rec.Source, "name", rec.Name)
		d.Log.Info("run_queued", "run_id", rec.RunID, "cluster", rec.Cluster, "holder", holder)
	default:
		d.Log.Info("run_accepted", "run_id", rec.RunID, "source", rec.Source, "name", rec.Name)
	}
	if err := d.Publish(ctx, rec, claimed, now); err != nil {
		return err
	}
	// The next step goes before the published mark: the mark is a second
	// write of the record, which waits for the rest of the second, and
	// Submit may write the record first. The message says what went out,
	// and Submit records it in its own write, so a job that ends at once
	// does not find the accepted event's claim still held.
	var sent error
	if start != nil {
		sent = d.SendStart(ctx, rec.RunID, *start, claimed...)
	}
	_, err := d.MarkPublished(ctx, rec.RunID, claimed)
	return errors.Join(sent, err)
}

// Resume carries on with a run an earlier delivery recorded: it announces
// what that delivery did not, and admits a run it did not admit.
func (d *Deps) Resume(ctx context.Context, rec *runs.Record) error {
	if rec.Phase == runs.Rejected {
		_, err := d.Announce(ctx, rec, runs.Rejected)
		return err
	}
	// Publish what an earlier delivery did not.
	rec, err := d.Advance(ctx, rec.RunID, func(*runs.Record) error { return runs.ErrNoChange })
	if err != nil || rec.Phase != runs.Accepted {
		// Admitted by an earlier delivery; a run it left PROVISIONED is
		// sent on by the sweep (StaleStep).
		return err
	}
	if !rec.WasPublished(runs.Accepted) {
		// Another delivery is publishing it: this one is retried.
		return fmt.Errorf("run %s: its accepted event is being published by another delivery", rec.RunID)
	}
	return d.Admit(ctx, rec)
}
