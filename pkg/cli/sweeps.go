package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// The commands that take a run ID take a sweep's ID too: a sweep is found
// when no run has the ID.

// sweepStore is the sweep records beside the run records (t.store first).
func (t *target) sweepStore() *sweeps.Store {
	return &sweeps.Store{Bucket: t.client.Bucket(t.stateBucket())}
}

// getSweep reads a sweep; errNoRun when there is none either.
func getSweep(ctx context.Context, t *target, id string) (*sweeps.Record, error) {
	sw, err := t.sweepStore().Get(ctx, id)
	if errors.Is(err, sweeps.ErrNotFound) {
		return nil, fmt.Errorf("%w or sweep %s in gs://%s/ (raydrop list shows the runs, raydrop list --sweeps the sweeps)", errNoRun, id, t.stateBucket())
	}
	if err != nil {
		return nil, friendly(err, t)
	}
	return sw, nil
}

// describeSweep prints a sweep: its phase, best trial and every trial.
func describeSweep(w io.Writer, sw *sweeps.Record) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "sweep\t%s\n", sw.SweepID)
	fmt.Fprintf(tw, "name\t%s\n", sw.Name)
	fmt.Fprintf(tw, "phase\t%s\n", sw.Phase)
	if sw.Message != "" {
		fmt.Fprintf(tw, "message\t%s\n", sw.Message)
	}
	fmt.Fprintf(tw, "source\t%s\n", sw.Source)
	fmt.Fprintf(tw, "search\t%s, %d trials, %d at once, early stopping %s\n", sw.Spec.Sweep.Search, len(sw.Trials), sw.Spec.SweepParallel(), sw.Spec.Sweep.EarlyStopping.Rule)
	h, usd := sw.Used()
	fmt.Fprintf(tw, "used\t%.2f GPU-hours, $%.2f\n", h, usd)
	if sw.Best > 0 {
		b := sw.Trials[sw.Best-1]
		fmt.Fprintf(tw, "best\ttrial %d (%s), held-out loss %.4g: %s\n", b.Index, b.RunID, *b.BestEvalLoss, b.BestCheckpoint)
	}
	if sw.Report != "" {
		fmt.Fprintf(tw, "report\t%s\n", sw.Report)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRIAL\tRUN\tPARAMETERS\tSTATE\tHELD-OUT LOSS\tSTEPS")
	for _, t := range sw.Trials {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\n", t.Index, t.RunID, paramsText(t), trialState(t), lossText(t), t.Steps)
	}
	_ = tw.Flush()
}

func paramsText(t sweeps.Trial) string {
	var ps []string
	for _, p := range t.Params {
		ps = append(ps, p.String())
	}
	return strings.Join(ps, " ")
}

// trialState is a trial's state as its sweep knows it.
func trialState(t sweeps.Trial) string {
	switch {
	case t.Ended != "":
		if t.Reason != "" {
			return string(t.Ended) + " (" + string(t.Reason) + ")"
		}
		return string(t.Ended)
	case t.Started():
		return "started on " + t.Cluster
	}
	return "pending"
}

// lossText is the trial's best held-out loss once it has ended, else its
// latest.
func lossText(t sweeps.Trial) string {
	switch {
	case t.BestEvalLoss != nil:
		return fmt.Sprintf("%.4g (best)", *t.BestEvalLoss)
	case len(t.EvalLosses) > 0:
		return fmt.Sprintf("%.4g", t.EvalLosses[len(t.EvalLosses)-1])
	}
	return "-"
}

// watchSweep follows a sweep to its end, a line per trial that starts or
// ends; it exits 0 when the sweep succeeded.
func watchSweep(ctx context.Context, e *env, t *target, id string, every time.Duration) int {
	seen := map[string]string{}
	for {
		sw, err := getSweep(ctx, t, id)
		if err != nil {
			return fail(e, "watch", err)
		}
		for _, tr := range sw.Trials {
			if s := trialState(tr); tr.Started() && seen[tr.RunID] != s {
				fmt.Fprintf(e.stdout, "%s  trial %d %s  %s  %s\n", time.Now().Format(time.TimeOnly), tr.Index, tr.RunID, s, paramsText(tr))
				seen[tr.RunID] = s
			}
		}
		// Ended, and announced: its report written, its event out.
		if sw.Phase.Terminal() && sw.Published {
			fmt.Fprintf(e.stdout, "%s  sweep %s %s: %s\n", time.Now().Format(time.TimeOnly), sw.SweepID, sw.Phase, sw.Message)
			if sw.Phase != sweeps.Succeeded {
				return ExitFailure
			}
			if sw.Best > 0 {
				b := sw.Trials[sw.Best-1]
				fmt.Fprintf(e.stdout, "best       trial %d (%s)  held-out loss %.4g\ncheckpoint %s\n", b.Index, b.RunID, *b.BestEvalLoss, b.BestCheckpoint)
			}
			return ExitOK
		}
		if !sleep(ctx, every) {
			fmt.Fprintln(e.stderr, "raydrop watch: interrupted")
			return ExitFailure
		}
	}
}

// listSweeps prints every sweep, newest first.
func listSweeps(ctx context.Context, e *env, t *target, asJSON bool) int {
	sums, err := t.sweepStore().List(ctx)
	if err != nil {
		return fail(e, "list", friendly(err, t))
	}
	sort.Slice(sums, func(i, j int) bool { return sums[i].Updated.After(sums[j].Updated) })
	if asJSON {
		type listedSweep struct {
			SweepID string       `json:"sweepId"`
			Phase   sweeps.Phase `json:"phase"`
			Updated time.Time    `json:"updated"`
		}
		out := make([]listedSweep, 0, len(sums))
		for _, s := range sums {
			out = append(out, listedSweep{s.SweepID, s.Phase, s.Updated})
		}
		return printJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SWEEP\tPHASE\tUPDATED")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.SweepID, s.Phase, s.Updated.Local().Format(time.DateTime))
	}
	_ = tw.Flush()
	return ExitOK
}

// cancelSweep asks for a sweep's cancellation, as for a run's: the object
// cancel/<sweep ID> in the intake bucket.
func cancelSweep(ctx context.Context, e *env, t *target, sw *sweeps.Record) int {
	if sw.Phase.Terminal() {
		return fail(e, "cancel", fmt.Errorf("sweep %s has already ended %s", sw.SweepID, sw.Phase))
	}
	w := t.client.Bucket(t.bucket).Object("cancel/" + sw.SweepID).NewWriter(ctx)
	if err := w.Close(); err != nil {
		return fail(e, "cancel", friendly(err, t))
	}
	fmt.Fprintf(e.stdout, "cancellation of sweep %s and its %d trials requested\n", sw.SweepID, len(sw.Trials))
	return ExitOK
}

// sweepReport prints where a sweep's report is, or writes it: the one
// finalize wrote when the sweep ended, else one rendered now.
func sweepReport(ctx context.Context, e *env, t *target, sw *sweeps.Record, out string) int {
	if out == "" {
		if sw.Report == "" {
			return fail(e, "report", fmt.Errorf("sweep %s (%s) has no report yet: finalize writes it when the sweep ends; `raydrop report %s -o FILE` renders one now", sw.SweepID, sw.Phase, sw.SweepID))
		}
		fmt.Fprintln(e.stdout, sw.Report)
		return ExitOK
	}
	var page []byte
	var err error
	if sw.Report != "" {
		bucket, name := report.SweepObject(sw)
		page, _, err = (&gcp.GCS{Client: t.client}).Read(ctx, bucket, name, 64<<20)
	} else {
		page, err = report.RenderSweep(sw)
	}
	if err != nil {
		return fail(e, "report", friendly(err, t))
	}
	if err := writeOut(e.stdout, out, page); err != nil {
		return fail(e, "report", err)
	}
	if out != "-" {
		fmt.Fprintf(e.stderr, "report of sweep %s (%s) in %s\n", sw.SweepID, sw.Phase, out)
	}
	return ExitOK
}

// ofSweep reports whether an event is about sweep id: the sweep's own
// event, or one of its trials'.
func ofSweep(subject string, data []byte, id string) bool {
	if subject == events.SweepSubjectPrefix+id {
		return true
	}
	var d struct {
		Trial *events.TrialRef `json:"trial"`
	}
	return json.Unmarshal(data, &d) == nil && d.Trial != nil && d.Trial.SweepID == id
}

// trialLine is a trial's place in its sweep, for a run's status.
func trialLine(r *runs.Record) string {
	if r.Trial == nil {
		return ""
	}
	var ps []string
	for _, p := range r.Trial.Params {
		ps = append(ps, p.String())
	}
	return fmt.Sprintf("trial %d of sweep %s (%s)", r.Trial.Index, r.Trial.SweepID, strings.Join(ps, " "))
}
