package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"golang.org/x/term"
	durpb "google.golang.org/protobuf/types/known/durationpb"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
)

// progressText is "step 12 · epoch 1.50/3 [#####.....] 50% · loss 1.234 ·
// elapsed 1m2s · ETA 1m2s" for a run's latest progress.
// While the attempt waits for capacity, it is why it waits.
func progressText(r *runs.Record, now time.Time) string {
	if a := r.CurrentAttempt(); a != nil && a.RunningAt == nil && a.EndedAt == nil && a.Waiting != "" {
		return a.Waiting
	}
	p := r.Progress
	if p == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "step %d", p.Step)
	frac := -1.0
	if p.TotalSteps > 0 {
		fmt.Fprintf(&b, " of %d", p.TotalSteps)
		frac = float64(p.Step) / float64(p.TotalSteps)
	}
	if r.Spec != nil && r.Spec.Training.Epochs > 0 {
		fmt.Fprintf(&b, " · epoch %.2f/%d", p.Epoch, r.Spec.Training.Epochs)
		if frac < 0 {
			frac = p.Epoch / float64(r.Spec.Training.Epochs)
		}
	}
	if frac >= 0 {
		frac = min(frac, 1)
		const width = 20
		n := int(frac * width)
		fmt.Fprintf(&b, " [%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100)
	}
	if p.Loss != nil {
		fmt.Fprintf(&b, " · loss %.4f", *p.Loss)
	}
	if t, ok := r.Times[runs.Running]; ok {
		el := now.Sub(t).Round(time.Second)
		fmt.Fprintf(&b, " · elapsed %s", el)
		if frac > 0 && frac < 1 {
			fmt.Fprintf(&b, " · ETA %s", time.Duration(float64(el)*(1-frac)/frac).Round(time.Second))
		}
	}
	return b.String()
}

func runWatch(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "watch")
	every := fs.Duration("interval", time.Second, "how often to read the run record")
	appear := fs.Duration("appear", time.Minute, "how long to wait for a just-submitted run's record to appear")
	reportWait := fs.Duration("report-wait", 2*time.Minute, "how long to wait, once the run has ended, for its report (written after the terminal event); 0: do not wait")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(e.stderr, "raydrop watch: give one run ID")
		return ExitUsage
	}
	st, done, err := t.store(ctx)
	if err != nil {
		return fail(e, "watch", err)
	}
	defer done()
	live := false
	if f, ok := e.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		live = true
	}
	lastPhase, lastLine := runs.Phase(""), ""
	var lastEntered time.Time // when the run entered the last phase shown
	appearBy := time.Now().Add(*appear)
	for {
		r, err := getRun(ctx, st, pos[0], t)
		if errors.Is(err, errNoRun) {
			// A sweep's ID: its trials are followed instead.
			if _, serr := getSweep(ctx, t, pos[0]); serr == nil {
				return watchSweep(ctx, e, t, pos[0], *every)
			}
		}
		if errors.Is(err, errNoRun) && time.Now().Before(appearBy) {
			if lastPhase == "" {
				fmt.Fprintf(e.stdout, "%s  waiting for the pipeline to pick the run up\n", time.Now().Format(time.TimeOnly))
				lastPhase = "WAITING"
			}
			if !sleep(ctx, *every) {
				return ExitFailure
			}
			continue
		}
		if err != nil {
			return fail(e, "watch", err)
		}
		if r.Phase != lastPhase {
			if live && lastLine != "" {
				fmt.Fprintln(e.stdout)
			}
			// Phases the run passed through between two reads (a short
			// job can be RUNNING for less than the interval), from the
			// times the record keeps.
			for _, p := range passed(r, lastEntered) {
				fmt.Fprintf(e.stdout, "%s  %s\n", r.Times[p].Local().Format(time.TimeOnly), p)
			}
			if t, ok := r.Times[r.Phase]; ok {
				lastEntered = t
			}
			fmt.Fprintf(e.stdout, "%s  %s", time.Now().Format(time.TimeOnly), r.Phase)
			if r.Message != "" && !r.Phase.Terminal() {
				fmt.Fprintf(e.stdout, "  %s", r.Message)
			}
			fmt.Fprintln(e.stdout)
			lastPhase, lastLine = r.Phase, ""
		}
		if line := progressText(r, time.Now()); line != "" && line != lastLine && !r.Phase.Terminal() {
			if live {
				fmt.Fprintf(e.stdout, "\r\033[K%s", line)
			} else {
				fmt.Fprintln(e.stdout, line)
			}
			lastLine = line
		}
		if r.Phase.Terminal() {
			if live && lastLine != "" {
				fmt.Fprintln(e.stdout)
			}
			code := finished(e, r)
			showReport(ctx, e, r, *every, *reportWait, func() (*runs.Record, error) { return getRun(ctx, st, pos[0], t) })
			return code
		}
		if !sleep(ctx, *every) {
			fmt.Fprintln(e.stderr, "raydrop watch: interrupted")
			return ExitFailure
		}
	}
}

// showReport prints the report of a run that has ended once it is
// announced (its report_ready event has gone out: the terminal event does
// not wait for it), reading the record again every interval for up to
// limit; or says why there is none, or that it is not ready yet. It never
// changes the exit code: the run's outcome does.
func showReport(ctx context.Context, e *env, r *runs.Record, every, limit time.Duration, get func() (*runs.Record, error)) {
	deadline := time.Now().Add(limit)
	for r.ReportOwed() && time.Now().Before(deadline) {
		if !sleep(ctx, every) {
			return
		}
		cur, err := get()
		if err != nil {
			fmt.Fprintf(e.stderr, "raydrop watch: the report: %v\n", err)
			return
		}
		r = cur
	}
	switch {
	case r.WasPublished(runs.ReportReady):
		fmt.Fprintf(e.stdout, "report     %s\n", r.Report)
	case r.NoReport != "":
		fmt.Fprintf(e.stderr, "run %s has no report: %s\n", r.RunID, r.NoReport)
	case r.ReportOwed():
		fmt.Fprintf(e.stderr, "the report of run %s is not ready after %s: raydrop report %s prints it once it is\n", r.RunID, limit, r.RunID)
	}
}

// passed lists the phases other than its current one that the run entered
// after the time after, in the order it entered them.
func passed(r *runs.Record, after time.Time) []runs.Phase {
	var ps []runs.Phase
	for p, t := range r.Times {
		if p != r.Phase && t.After(after) && !t.After(r.Times[r.Phase]) {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b runs.Phase) int { return r.Times[a].Compare(r.Times[b]) })
	return ps
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// finished prints how a run ended: its checkpoints, or why it failed.
func finished(e *env, r *runs.Record) int {
	if r.Phase == runs.Stopped {
		// A sweep's trial its early stopping rule ended: not a failure.
		fmt.Fprintf(e.stdout, "run %s stopped early (%s): %s\n", r.RunID, r.Reason, r.Message)
		return ExitOK
	}
	if r.Phase == runs.Succeeded {
		if r.Result != nil {
			for _, c := range r.Result.Checkpoints {
				fmt.Fprintf(e.stdout, "checkpoint %s  (step %d, epoch %g)\n", c.URI, c.Step, c.Epoch)
			}
			if r.Result.Best != nil {
				fmt.Fprintf(e.stdout, "best       %s\n", r.Result.Best.URI)
			}
		}
		return ExitOK
	}
	fmt.Fprintf(e.stderr, "run %s ended %s (%s): %s\n", r.RunID, r.Phase, r.Reason, r.Message)
	for _, p := range r.Problems {
		fmt.Fprintf(e.stderr, "  %s\n", p)
	}
	return ExitFailure
}

func runEvents(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "events")
	asJSON := fs.Bool("json", false, "print each event as a structured-mode CloudEvent (JSON with specversion, type, id, source, subject, time, data), one per line")
	count := fs.Int("count", 0, "stop after printing this many events (0: until interrupted)")
	runID := fs.String("run", "", "print only this run's events")
	sweepID := fs.String("sweep", "", "print only this sweep's events: its own and its trials'")
	typ := fs.String("type", "", "print only events of this type: a phase ("+strings.Join(events.Phases, ", ")+") or the full type "+events.TypePrefix+"<phase>")
	if _, code, ok := parse(e, fs, args); !ok {
		return code
	}
	want, err := eventType(*typ)
	if err == nil && *count < 0 {
		err = fmt.Errorf("--count %d: must be 0 (no limit) or more", *count)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "raydrop events: %v\n", err)
		return ExitUsage
	}
	if err := t.needProject(); err != nil {
		return fail(e, "events", err)
	}
	ps, err := pubsub.NewClient(ctx, t.project)
	if err != nil {
		return fail(e, "events", friendly(err, t))
	}
	defer func() { _ = ps.Close() }()
	// A subscription of its own, removed on exit (and by Pub/Sub after a
	// day unused, should the process die).
	sub := fmt.Sprintf("projects/%s/subscriptions/raydrop-cli-%d", t.project, time.Now().UnixNano())
	if _, err := ps.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: sub, Topic: fmt.Sprintf("projects/%s/topics/%s", t.project, t.events), AckDeadlineSeconds: 30,
		ExpirationPolicy: &pubsubpb.ExpirationPolicy{Ttl: durationpb(24 * time.Hour)},
	}); err != nil {
		return fail(e, "events", friendly(err, t))
	}
	defer func() {
		_ = ps.SubscriptionAdminClient.DeleteSubscription(context.Background(), &pubsubpb.DeleteSubscriptionRequest{Subscription: sub})
	}()
	fmt.Fprintf(e.stderr, "following %s (Ctrl-C stops)\n", t.events)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex // Receive calls the handler from several goroutines
	n := 0
	err = ps.Subscriber(sub).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		ev, err := events.FromPubSub(m.Attributes, m.Data)
		if err != nil {
			fmt.Fprintf(e.stderr, "raydrop events: message %s is not a CloudEvent: %v\n", m.ID, err)
			return
		}
		if (want != "" && ev.Type() != want) || (*runID != "" && ev.Subject() != events.SubjectPrefix+*runID) ||
			(*sweepID != "" && !ofSweep(ev.Subject(), ev.Data(), *sweepID)) {
			return
		}
		line := fmt.Sprintf("%s  %-34s %s", ev.Time().Local().Format(time.TimeOnly), ev.Type(), ev.Subject())
		if *asJSON {
			b, err := json.Marshal(ev) // structured content mode
			if err != nil {
				fmt.Fprintf(e.stderr, "raydrop events: event %s: %v\n", ev.ID(), err)
				return
			}
			line = string(b)
		}
		mu.Lock()
		defer mu.Unlock()
		if *count > 0 && n >= *count {
			return
		}
		fmt.Fprintln(e.stdout, line)
		n++
		if *count > 0 && n >= *count {
			cancel()
		}
	})
	if err != nil && ctx.Err() == nil {
		return fail(e, "events", friendly(err, t))
	}
	return ExitOK
}

// eventType is the CloudEvent type a --type value names: a phase, or the
// full type; "" for none.
func eventType(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if p, ok := strings.CutPrefix(v, events.SweepTypePrefix); ok && slices.Contains(events.SweepPhases, p) {
		return v, nil
	}
	phase := strings.TrimPrefix(v, events.TypePrefix)
	if !slices.Contains(events.Phases, phase) {
		return "", fmt.Errorf("--type %q: not an event type (allowed: %s, or %s<phase>, or %s<%s>)", v, strings.Join(events.Phases, ", "), events.TypePrefix, events.SweepTypePrefix, strings.Join(events.SweepPhases, "|"))
	}
	return events.Type(phase), nil
}

func runDev(ctx context.Context, e *env, args []string) int {
	fs := newFlags(e, "dev")
	if _, code, ok := parse(e, fs, args); !ok {
		return code
	}
	root, err := repoRoot()
	if err != nil {
		return fail(e, "dev", err)
	}
	cmd := exec.CommandContext(ctx, "make", "dev")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr, cmd.Stdin = e.stdout, e.stderr, e.stdin
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil && ctx.Err() == nil {
		return fail(e, "dev", err)
	}
	return ExitOK
}

// repoRoot finds the raydrop checkout above the working directory: the
// local cloud is built from it.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/raydrop/raydrop\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside a raydrop checkout: the local cloud runs from the repository (cd into it, then raydrop dev)")
		}
		dir = parent
	}
}

func durationpb(d time.Duration) *durpb.Duration { return durpb.New(d) }
