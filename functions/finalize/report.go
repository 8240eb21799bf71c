package finalize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
)

// reportOf writes the report of a run that is ending (FINISHING, with res
// the checkpoints discover found) or has ended without one yet, and
// returns its URI for the record and the terminal event. "" means the run
// has no report: its spec was rejected, or the report cannot be written
// for good (the function may not write the bucket): the terminal event
// does not wait for a report.
func (h *Handler) reportOf(ctx context.Context, rec *runs.Record, res *checkpoints.Result, unreadable error, now time.Time) (string, error) {
	if rec.Report != "" || rec.Phase != runs.Finishing && !rec.Unannounced() {
		return rec.Report, nil
	}
	bucket, name := report.Object(rec)
	if bucket == "" {
		return "", nil
	}
	// The report shows the record as the terminal write will leave it.
	end, err := clone(rec)
	if err != nil {
		return "", err
	}
	if end.Phase == runs.Finishing && res != nil {
		if err := end.MarkEnded(res, unreadable, now); err != nil {
			return "", err
		}
	}
	d := h.Deps
	page, err := report.Build(ctx, d.Objects.Bucket, end, d.Config, now)
	if err == nil {
		// Once: an earlier delivery's copy stands.
		if err = d.Objects.Create(ctx, bucket, name, page, report.ContentType); errors.Is(err, gcp.ErrExists) {
			err = nil
		}
	}
	switch {
	case err == nil:
		d.Log.Info("report_written", "run_id", rec.RunID, "uri", report.URI(rec), "bytes", len(page))
		return report.URI(rec), nil
	case gcp.Unreadable(err):
		d.Log.Error("report_not_written", "run_id", rec.RunID, "uri", report.URI(rec), "error", err.Error())
		return "", nil
	}
	return "", fmt.Errorf("report of run %s: %w", rec.RunID, err)
}

func clone(r *runs.Record) (*runs.Record, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	out := &runs.Record{}
	return out, json.Unmarshal(b, out)
}
