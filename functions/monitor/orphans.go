package monitor

import (
	"context"
	"errors"

	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// releaseOrphans takes back the leases whose holder has had no record for
// HolderWithoutRecord: a new run takes its cluster before its record is
// written, and if that delivery dies and is never redelivered (Eventarc
// gave up, the message went to the dead-letter topic) nothing else would
// ever free the cluster. Clusters with queued runs are left to those runs'
// checks (stuck), which take the lease back the same way. known holds the
// IDs of the runs the sweep listed, ended those that have ended. The
// leases of failed runs that keep their head for a look are passed on
// here too, once their time is up (passOnKept).
func (h *Handler) releaseOrphans(ctx context.Context, known, ended map[string]bool, queued map[string][]string) []error {
	d := h.Deps
	held, err := d.Leases.Held(ctx)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range held {
		if ended[l.Holder] {
			if err := h.passOnKept(ctx, l.Holder); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if known[l.Holder] || len(queued[l.Namespace+"/"+l.Cluster]) > 0 || d.Time().Sub(l.Updated) <= pipeline.HolderWithoutRecord {
			continue
		}
		// Listed before the records were? Read the holder's record to be sure.
		if _, err := d.Runs.Get(ctx, l.Holder); !errors.Is(err, runs.ErrNotFound) {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		d.Log.Warn("lease_released", "cluster", l.Namespace+"/"+l.Cluster, "holder", l.Holder, "why", "the holder has no record")
		if _, err := d.PassOn(ctx, l.Namespace, l.Cluster, l.Holder); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// passOnKept passes on the cluster of an ended run that kept its head pod
// for a look (runs.HeadKept), once its time is up: it deletes the head pod
// (KubeRay starts a fresh one, so the next run never meets the failed
// run's Ray session), records the release, then passes the cluster on.
// A crash anywhere in between is finished by the next sweep: the record
// says the head is released before the lease goes.
func (h *Handler) passOnKept(ctx context.Context, runID string) error {
	d := h.Deps
	rec, err := d.Runs.Get(ctx, runID)
	if err != nil {
		return err
	}
	k := rec.HeadKept
	if k == nil || rec.KeepsHead(d.Time()) {
		return nil // none kept (the queued runs' checks pass it on), or still kept
	}
	if k.ReleasedAt == nil {
		if err := d.DeletePod(ctx, rec.Namespace, k.Pod); err != nil {
			return err
		}
		d.Log.Info("head_released", "run_id", runID, "cluster", rec.Namespace+"/"+rec.Cluster, "pod", k.Pod, "kept_until", k.Until)
		if _, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
			if r.HeadKept == nil || r.HeadKept.ReleasedAt != nil {
				return runs.ErrNoChange
			}
			now := d.Time()
			r.HeadKept.ReleasedAt = &now
			return nil
		}); err != nil {
			return err
		}
	}
	_, err = d.PassOn(ctx, rec.Namespace, rec.Cluster, runID)
	return err
}
