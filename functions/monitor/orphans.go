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
// IDs of the runs the sweep listed.
func (h *Handler) releaseOrphans(ctx context.Context, known map[string]bool, queued map[string][]string) []error {
	d := h.Deps
	held, err := d.Leases.Held(ctx)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range held {
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
