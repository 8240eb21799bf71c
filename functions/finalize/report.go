package finalize

import (
	"context"
	"errors"
	"fmt"

	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
)

// report writes the report of a run whose terminal event has gone out, and
// announces it (report_ready), unless that is done or the run has none
// (runs.Record.ReportOwed). The page is written once: a delivery that died
// after writing it leaves it for the next, which records and announces it.
// A report that cannot be written for good (the function may not write the
// run's bucket, or read what the page shows) is recorded as none, so the run
// does not come back here for it.
func (h *Handler) report(ctx context.Context, rec *runs.Record) error {
	if !rec.ReportOwed() || !rec.WasPublished(rec.Phase) {
		return nil
	}
	d := h.Deps
	uri := rec.Report
	if uri == "" {
		bucket, name := report.Object(rec)
		page, err := report.Build(ctx, d.Objects.Bucket, rec, d.Config, d.Time())
		if err == nil {
			// Once: an earlier delivery's copy stands.
			if err = d.Objects.Create(ctx, bucket, name, page, report.ContentType); errors.Is(err, gcp.ErrExists) {
				err = nil
			}
		}
		switch {
		case gcp.Unreadable(err):
			d.Log.Error("report_not_written", "run_id", rec.RunID, "uri", report.URI(rec), "error", err.Error())
			return h.noReport(ctx, rec.RunID, err)
		case err != nil:
			return fmt.Errorf("report of run %s: %w", rec.RunID, err)
		}
		uri = report.URI(rec)
		d.Log.Info("report_written", "run_id", rec.RunID, "uri", uri, "bytes", len(page))
	}
	_, err := d.AnnounceReport(ctx, rec.RunID, uri)
	return err
}

// noReport records that the run's report cannot be written, and why.
func (h *Handler) noReport(ctx context.Context, runID string, why error) error {
	_, err := h.Deps.Runs.Update(ctx, runID, func(r *runs.Record) error {
		if r.NoReport != "" || r.Report != "" {
			return runs.ErrNoChange
		}
		r.NoReport = why.Error()
		return nil
	})
	return err
}
