package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/report"
)

// runReport prints where a run's report is, or writes it to a file: the
// one finalize wrote when the run ended, else one rendered now from what
// the run has written so far.
func runReport(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "report")
	out := fs.String("o", "", "write the report to this file (- for standard output) instead of printing its URI")
	price := fs.String("gpu-hour-usd", envOr(config.EnvGPUHourUSD, config.DefaultGPUHourUSD), "price of a GPU-hour, for a report rendered now (RAYDROP_GPU_HOUR_USD)")
	_, r, sw, done, code, ok := oneRunOrSweep(ctx, e, "report", fs, t, args)
	if !ok {
		return code
	}
	defer done()
	if sw != nil {
		return sweepReport(ctx, e, t, sw, *out)
	}
	usd, err := strconv.ParseFloat(*price, 64)
	if err != nil || usd < 0 {
		fmt.Fprintf(e.stderr, "raydrop report: --gpu-hour-usd %q is not a non-negative number\n", *price)
		return ExitUsage
	}
	if report.URI(r) == "" {
		return fail(e, "report", fmt.Errorf("run %s has no report: its spec was rejected (raydrop status %s shows why)", r.RunID, r.RunID))
	}
	if *out == "" {
		if r.Report == "" {
			return fail(e, "report", fmt.Errorf("run %s (%s) has no report yet: finalize writes it when the run ends; `raydrop report %s -o FILE` renders one now", r.RunID, r.Phase, r.RunID))
		}
		fmt.Fprintln(e.stdout, r.Report)
		return ExitOK
	}
	var page []byte
	if r.Report != "" {
		bucket, name := report.Object(r)
		page, _, err = (&gcp.GCS{Client: t.client}).Read(ctx, bucket, name, 64<<20)
	} else {
		page, err = report.Build(ctx, (&gcp.GCS{Client: t.client}).Bucket, r, config.Config{GPUHourUSD: usd}, time.Now().UTC())
	}
	if err != nil {
		return fail(e, "report", friendly(err, t))
	}
	if err := writeOut(e.stdout, *out, page); err != nil {
		return fail(e, "report", err)
	}
	if *out != "-" {
		how := "written when the run ended"
		if r.Report == "" {
			how = fmt.Sprintf("rendered now: the run is %s", r.Phase)
		}
		fmt.Fprintf(e.stderr, "report of run %s (%s) in %s\n", r.RunID, how, *out)
	}
	return ExitOK
}

// writeOut writes data to the file name, or to w for "-".
func writeOut(w io.Writer, name string, data []byte) error {
	if name == "-" {
		_, err := w.Write(data)
		return err
	}
	return os.WriteFile(name, data, 0o644)
}
