package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/runs"
)

// runDiagnose says why a run ended other than succeeded, from its bucket
// alone (the cluster may be gone): the cause and its hint, the first error
// lines of each rank, the pods' last states, the events that matter, and
// where the whole evidence lies. For a sweep, each trial that failed.
func runDiagnose(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "diagnose")
	attempt := fs.Int("attempt", 0, "the attempt (default: the run's last one)")
	asJSON := fs.Bool("json", false, "print the diagnosis as JSON (for a sweep, a list of them)")
	st, r, sw, done, code, ok := oneRunOrSweep(ctx, e, "diagnose", fs, t, args)
	if !ok {
		return code
	}
	defer done()
	var recs []*runs.Record
	if sw != nil {
		if *attempt != 0 {
			fmt.Fprintln(e.stderr, "raydrop diagnose: --attempt is for a run, not a sweep")
			return ExitUsage
		}
		for _, tr := range sw.Trials {
			if tr.Ended == "" || tr.Ended == runs.Succeeded || tr.Ended == runs.Stopped {
				continue
			}
			rec, err := getRun(ctx, st, tr.RunID, t)
			if err != nil {
				return fail(e, "diagnose", friendly(err, t))
			}
			recs = append(recs, rec)
		}
		if len(recs) == 0 {
			if *asJSON {
				return printJSON(e, []cause.Diagnosis{})
			}
			fmt.Fprintf(e.stdout, "sweep %s (%s): no trial failed\n", sw.SweepID, sw.Phase)
			return ExitOK
		}
	} else {
		if !r.Phase.Terminal() || r.Phase == runs.Succeeded {
			return fail(e, "diagnose", fmt.Errorf("run %s is %s: only a run that ended other than succeeded has a cause (raydrop status %s shows it)", r.RunID, r.Phase, r.RunID))
		}
		if *attempt < 0 || *attempt > r.Attempt {
			return fail(e, "diagnose", fmt.Errorf("run %s has attempts 1 to %d, not %d", r.RunID, r.Attempt, *attempt))
		}
		recs = []*runs.Record{r}
	}
	g := &gcp.GCS{Client: t.client}
	out := make([]cause.Diagnosis, 0, len(recs))
	for _, rec := range recs {
		n := *attempt
		if n == 0 {
			n = rec.Attempt
		}
		out = append(out, diagnose(ctx, g, rec, n))
	}
	if *asJSON {
		if sw == nil {
			return printJSON(e, out[0])
		}
		return printJSON(e, out)
	}
	for i, d := range out {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		printDiagnosis(e.stdout, d)
	}
	return ExitOK
}

// diagnose reads attempt n's evidence of rec from its bucket.
func diagnose(ctx context.Context, g *gcp.GCS, rec *runs.Record, n int) cause.Diagnosis {
	var mark *cause.Mark
	if rec.Result != nil && rec.Result.Mark != nil {
		mark = &cause.Mark{Status: rec.Result.Mark.Status, Error: rec.Result.Mark.Error}
	}
	if rec.Evidence == "" || n == 0 {
		return cause.Diagnose(ctx, nil, "", "", rec, mark)
	}
	bucket, folder, err := evidence.Locate(rec.Evidence, n)
	if err != nil {
		d := cause.Diagnose(ctx, nil, "", "", rec, mark)
		d.Unread = err.Error()
		return d
	}
	d := cause.Diagnose(ctx, g.Bucket(bucket), folder, "gs://"+bucket+"/"+folder+"/", rec, mark)
	d.Attempt = n
	return d
}

// printDiagnosis prints a diagnosis for people.
func printDiagnosis(w io.Writer, d cause.Diagnosis) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run\t%s (%s, attempt %d)\n", d.RunID, strings.ToUpper(d.Phase), d.Attempt)
	if d.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s: %s\n", d.Reason, d.Message)
	}
	fmt.Fprintf(tw, "cause\t%s: %s\n", d.Cause.Kind, d.Cause.Summary)
	if d.Cause.Hint != "" {
		fmt.Fprintf(tw, "hint\t%s\n", d.Cause.Hint)
	}
	evidenceLine := d.Evidence
	if evidenceLine == "" {
		evidenceLine = "none kept (the run had no attempt on a cluster)"
	}
	fmt.Fprintf(tw, "evidence\t%s\n", evidenceLine)
	if d.Unread != "" {
		fmt.Fprintf(tw, "unread\t%s\n", d.Unread)
	}
	_ = tw.Flush()
	if len(d.Cause.Lines) > 0 {
		fmt.Fprintf(w, "\nwhat shows it (%s):\n", d.Cause.Source)
		for _, l := range d.Cause.Lines {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	if len(d.Ranks) > 0 {
		fmt.Fprintln(w, "\nthe first error lines of each rank:")
		for _, r := range d.Ranks {
			rank := "rank ?"
			if r.Rank >= 0 {
				rank = fmt.Sprintf("rank %d", r.Rank)
			}
			fmt.Fprintf(w, "  %s on %s (%s):\n", rank, r.Pod, r.Source)
			for _, l := range r.Lines {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
	printStacks(w, d)
	if len(d.Pods) > 0 {
		fmt.Fprintln(w, "\npods:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  POD\tNODE\tPHASE\tCONTAINER\tSTATE\tEXIT\tRESTARTS\tBEFORE THE LAST RESTART")
		for _, p := range d.Pods {
			phase := p.Phase
			if p.Deleting {
				phase += " (deleting)"
			}
			for _, c := range p.Containers {
				state, exit := c.State, ""
				if c.Reason != "" {
					state += ": " + c.Reason
				}
				if c.ExitCode != nil {
					exit = fmt.Sprint(*c.ExitCode)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.Pod, p.Node, phase, c.Name, state, exit, c.Restarts, c.Last)
			}
		}
		_ = tw.Flush()
	}
	if len(d.Events) > 0 {
		fmt.Fprintln(w, "\nevents:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, ev := range d.Events {
			when := ""
			if !ev.Time.IsZero() {
				when = ev.Time.Local().Format("15:04:05")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", when, ev.Object, ev.Type, ev.Reason, ev.Message)
		}
		_ = tw.Flush()
	}
}

// printStacks prints where each rank's main thread waited, when the ranks
// wrote their stacks (a suspected stall), and the ranks the others waited
// for.
func printStacks(w io.Writer, d cause.Diagnosis) {
	if len(d.Stacks) == 0 {
		return
	}
	fmt.Fprintf(w, "\nwhere each rank waited (%s%s/):\n", d.Evidence, checkpoints.StacksDir)
	for _, s := range d.Stacks {
		rank := "rank ?"
		if s.Rank >= 0 {
			rank = fmt.Sprintf("rank %d", s.Rank)
		}
		where := s.Where
		if where == "" {
			where = "(no main thread in " + s.Source + ")"
		}
		tag := ""
		if s.InCollective {
			tag = "  [in a collective]"
		}
		fmt.Fprintf(w, "  %s: %s%s\n", rank, where, tag)
	}
	if len(d.Outside) > 0 {
		fmt.Fprintf(w, "  ranks %v waited outside any collective: the others waited for them\n", d.Outside)
	}
}
