package finalize

import (
	"context"
	"errors"

	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// sweep advances a sweep (pipeline.AdvanceSweep) and, once its trials have
// all ended, ends it: its report, then its event. leaving is a trial
// handing its cluster over.
func (h *Handler) sweep(ctx context.Context, id, leaving string) error {
	err := h.Deps.AdvanceSweep(ctx, id, leaving, h.endSweep)
	if errors.Is(err, sweeps.ErrNotFound) {
		return pipeline.Permanent(err)
	}
	return err
}

// endSweep writes an ended sweep's report beside its trials (once: an
// earlier delivery's copy stands) and announces the sweep. A report that
// cannot be written for good (no permission on the bucket) is logged and
// left out; the event goes out all the same.
func (h *Handler) endSweep(ctx context.Context, sw *sweeps.Record) error {
	d := h.Deps
	if sw.Report == "" {
		page, err := report.RenderSweep(sw)
		if err != nil {
			return pipeline.Permanent(err)
		}
		bucket, name := report.SweepObject(sw)
		uri := report.SweepURI(sw)
		err = d.Objects.Create(ctx, bucket, name, page, report.ContentType)
		switch {
		case err == nil, errors.Is(err, gcp.ErrExists):
			d.Log.Info("report_written", "sweep_id", sw.SweepID, "uri", uri, "bytes", len(page))
		case gcp.Unreadable(err):
			d.Log.Error("report_not_written", "sweep_id", sw.SweepID, "uri", uri, "error", err.Error())
			uri = ""
		default:
			return err
		}
		if uri != "" {
			if _, err := d.Sweeps.Update(ctx, sw.SweepID, func(r *sweeps.Record) error {
				if r.Report != "" {
					return sweeps.ErrNoChange
				}
				r.Report = uri
				return nil
			}); err != nil {
				return err
			}
		}
	}
	return d.AnnounceSweep(ctx, sw.SweepID)
}
