package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// target is where the commands find the deployment: flags over RAYDROP_*
// variables over defaults.
type target struct {
	project, bucket, state, requests, events string
	client                                   *storage.Client // set by store
}

func (t *target) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.project, "project", firstEnv(config.EnvProject, "GOOGLE_CLOUD_PROJECT"), "Google Cloud project of the topics (RAYDROP_PROJECT)")
	fs.StringVar(&t.bucket, "bucket", os.Getenv(config.EnvIntakeBucket), "intake bucket (RAYDROP_INTAKE_BUCKET)")
	fs.StringVar(&t.state, "state-bucket", os.Getenv(config.EnvStateBucket), "bucket of the run records (RAYDROP_STATE_BUCKET; default: the intake bucket)")
	fs.StringVar(&t.requests, "requests-topic", envOr(wiring.TopicEnv(wiring.TopicRequests), wiring.DefaultTopics().Requests), "requests topic")
	fs.StringVar(&t.events, "events-topic", envOr(wiring.TopicEnv(wiring.TopicEvents), wiring.DefaultTopics().Events), "public events topic")
}

// deploymentFlags is the flag set of a command that talks to a deployment.
func deploymentFlags(e *env, name string) (*flag.FlagSet, *target) {
	fs := newFlags(e, name)
	t := &target{}
	t.flags(fs)
	return fs, t
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// friendly turns client errors into what to do about them.
func friendly(err error, t *target) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "could not find default credentials"):
		return errors.New("no Google Cloud credentials: run `gcloud auth application-default login`, or point STORAGE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST at the local cloud (`make dev` prints them)")
	case errors.Is(err, storage.ErrBucketNotExist):
		return fmt.Errorf("bucket not found: check --bucket (RAYDROP_INTAKE_BUCKET, now %q) and --state-bucket (RAYDROP_STATE_BUCKET, now %q)", t.bucket, t.state)
	case strings.Contains(msg, "NotFound") && strings.Contains(msg, "topic"):
		return fmt.Errorf("topic not found in project %q: check --project and the topic flags: %w", t.project, err)
	}
	return err
}

func (t *target) needBucket() error {
	if t.bucket == "" {
		return errors.New("no intake bucket: pass --bucket or set RAYDROP_INTAKE_BUCKET")
	}
	return nil
}

func (t *target) needProject() error {
	if t.project == "" {
		return errors.New("no project: pass --project or set RAYDROP_PROJECT")
	}
	return nil
}

func (t *target) store(ctx context.Context) (*runs.Store, func(), error) {
	if err := t.needBucket(); err != nil {
		return nil, nil, err
	}
	c, err := storage.NewClient(ctx)
	if err != nil {
		return nil, nil, friendly(err, t)
	}
	t.client = c
	return &runs.Store{Bucket: c.Bucket(t.stateBucket())}, func() { _ = c.Close() }, nil
}

// stateBucket is the bucket of the run records.
func (t *target) stateBucket() string {
	if t.state != "" {
		return t.state
	}
	return t.bucket
}

func fail(e *env, cmd string, err error) int {
	fmt.Fprintf(e.stderr, "raydrop %s: %v\n", cmd, err)
	return ExitFailure
}

func runSubmit(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "submit")
	via := fs.String("via", "bucket", "bucket: upload to the intake bucket's jobs/; topic: publish to the requests topic")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 || (*via != "bucket" && *via != "topic") {
		fmt.Fprintln(e.stderr, "raydrop submit: give one spec file, and --via bucket or --via topic")
		return ExitUsage
	}
	s, data, ok := loadSpec(e, pos[0])
	if !ok {
		return ExitFailure
	}
	if *via == "topic" {
		if err := t.needProject(); err != nil {
			return fail(e, "submit", err)
		}
		ps, err := pubsub.NewClient(ctx, t.project)
		if err != nil {
			return fail(e, "submit", friendly(err, t))
		}
		defer func() { _ = ps.Close() }()
		pub := ps.Publisher(t.requests)
		defer pub.Stop()
		id, err := pub.Publish(ctx, &pubsub.Message{Data: data}).Get(ctx)
		if err != nil {
			return fail(e, "submit", friendly(err, t))
		}
		runID := s.RunID
		if runID == "" {
			runID = names.RunIDFromMessage(t.requests, id)
		}
		fmt.Fprintln(e.stdout, runID)
		sweepNote(e, s, runID)
		return ExitOK
	}
	if err := t.needBucket(); err != nil {
		return fail(e, "submit", err)
	}
	gcs, err := storage.NewClient(ctx)
	if err != nil {
		return fail(e, "submit", friendly(err, t))
	}
	defer func() { _ = gcs.Close() }()
	object := "jobs/" + strings.TrimSuffix(filepath.Base(pos[0]), filepath.Ext(pos[0])) + ".json"
	w := gcs.Bucket(t.bucket).Object(object).NewWriter(ctx)
	w.ContentType = "application/json"
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return fail(e, "submit", friendly(err, t))
	}
	if err := w.Close(); err != nil {
		return fail(e, "submit", friendly(err, t))
	}
	id := names.RunIDFromObject(t.bucket, object, w.Attrs().Generation)
	fmt.Fprintln(e.stdout, id)
	sweepNote(e, s, id)
	return ExitOK
}

// sweepNote tells, on standard error, that a submitted spec is a sweep:
// the ID printed is the sweep's, its trials runs of their own.
func sweepNote(e *env, s *spec.JobSpec, id string) {
	if !s.Swept() {
		return
	}
	trials, _ := s.Trials()
	fmt.Fprintf(e.stderr, "sweep %s: %d trials, %d at once (raydrop watch %s follows it)\n", id, len(trials), s.SweepParallel(), id)
}

func runList(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "list")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	ofSweeps := fs.Bool("sweeps", false, "list the sweeps instead of the runs")
	if _, code, ok := parse(e, fs, args); !ok {
		return code
	}
	st, done, err := t.store(ctx)
	if err != nil {
		return fail(e, "list", err)
	}
	defer done()
	if *ofSweeps {
		return listSweeps(ctx, e, t, *asJSON)
	}
	sums, err := st.List(ctx)
	if err != nil {
		return fail(e, "list", friendly(err, t))
	}
	sort.Slice(sums, func(i, j int) bool { return sums[i].Updated.After(sums[j].Updated) })
	if *asJSON {
		out := make([]listed, 0, len(sums))
		for _, s := range sums {
			out = append(out, listedOf(s))
		}
		return printJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tPHASE\tCLUSTER\tUPDATED")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.RunID, s.Phase, s.Cluster, s.Updated.Local().Format(time.DateTime))
	}
	_ = tw.Flush()
	return ExitOK
}

// listed is one run of `list --json`: the run record's own keys and values
// (`status --json` prints the whole record), read from the record's
// metadata without reading the record.
type listed struct {
	RunID           string     `json:"runId"`
	Phase           runs.Phase `json:"phase"`
	Cluster         string     `json:"cluster,omitempty"`
	Namespace       string     `json:"namespace,omitempty"`
	UpdatedAt       time.Time  `json:"updatedAt"`
	CancelRequested bool       `json:"cancelRequested,omitempty"`
}

func listedOf(s runs.Summary) listed {
	l := listed{RunID: s.RunID, Phase: s.Phase, UpdatedAt: s.UpdatedAt, CancelRequested: s.CancelRequested}
	l.Namespace, l.Cluster, _ = strings.Cut(s.Cluster, "/")
	if l.UpdatedAt.IsZero() { // a record written before its metadata carried the time
		l.UpdatedAt = s.Updated
	}
	return l
}

func printJSON(e *env, v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return ExitFailure
	}
	return ExitOK
}

func runStatus(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "status")
	asJSON := fs.Bool("json", false, "print the run record as JSON")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) == 0 {
		return runList(ctx, e, args)
	}
	st, done, err := t.store(ctx)
	if err != nil {
		return fail(e, "status", err)
	}
	defer done()
	r, err := getRun(ctx, st, pos[0], t)
	if errors.Is(err, errNoRun) {
		sw, serr := getSweep(ctx, t, pos[0])
		if serr != nil {
			return fail(e, "status", serr)
		}
		if *asJSON {
			return printJSON(e, sw)
		}
		describeSweep(e.stdout, sw)
		return ExitOK
	}
	if err != nil {
		return fail(e, "status", err)
	}
	if *asJSON {
		return printJSON(e, r)
	}
	describe(e.stdout, r)
	return ExitOK
}

// errNoRun is an unknown run ID.
var errNoRun = errors.New("no run")

func getRun(ctx context.Context, st *runs.Store, id string, t *target) (*runs.Record, error) {
	if msg := spec.CheckRunID(id); msg != "" {
		return nil, fmt.Errorf("run id %s", msg)
	}
	r, err := st.Get(ctx, id)
	if errors.Is(err, runs.ErrNotFound) {
		return nil, fmt.Errorf("%w %s in gs://%s/runs/ (raydrop list shows the runs)", errNoRun, id, t.bucket)
	}
	if err != nil {
		return nil, friendly(err, t)
	}
	return r, nil
}

func describe(w io.Writer, r *runs.Record) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "run\t%s\n", r.RunID)
	fmt.Fprintf(tw, "name\t%s\n", r.Name)
	fmt.Fprintf(tw, "phase\t%s\n", r.Phase)
	if r.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", r.Reason)
	}
	if r.Message != "" {
		fmt.Fprintf(tw, "message\t%s\n", r.Message)
	}
	if c := r.Cause; c != nil {
		fmt.Fprintf(tw, "cause\t%s: %s\n", c.Kind, c.Summary)
		if c.Hint != "" {
			fmt.Fprintf(tw, "hint\t%s\n", c.Hint)
		}
	}
	fmt.Fprintf(tw, "source\t%s\n", r.Source)
	if line := trialLine(r); line != "" {
		fmt.Fprintf(tw, "sweep\t%s\n", line)
	}
	if r.Cluster != "" {
		fmt.Fprintf(tw, "cluster\t%s/%s\n", r.Namespace, r.Cluster)
	}
	if r.Attempt > 0 {
		fmt.Fprintf(tw, "attempt\t%d\n", r.Attempt)
	}
	if line := stallLine(r); line != "" {
		fmt.Fprintf(tw, "stalled\t%s\n", line)
	}
	if k := r.HeadKept; k != nil {
		if k.ReleasedAt != nil {
			fmt.Fprintf(tw, "head\t%s was kept for a look until %s, deleted at %s\n", k.Pod, k.Until.UTC().Format(time.DateTime), k.ReleasedAt.UTC().Format(time.DateTime))
		} else {
			fmt.Fprintf(tw, "head\tkept for a look until %s UTC: kubectl -n %s port-forward pod/%s 8265 serves its Ray dashboard; the cluster's next run waits until then\n",
				k.Until.UTC().Format(time.DateTime), r.Namespace, k.Pod)
		}
	}
	if line := imageText(r); line != "" {
		fmt.Fprintf(tw, "image\t%s\n", line)
	}
	if line := modelText(r); line != "" {
		fmt.Fprintf(tw, "model\t%s\n", line)
	}
	if c := capacityText(r); c != "" {
		fmt.Fprintf(tw, "capacity\t%s\n", c)
	}
	if line := startupText(r); line != "" {
		fmt.Fprintf(tw, "start-up\t%s\n", line)
	}
	if line := CheckText(r); line != "" {
		fmt.Fprintf(tw, "data check\t%s\n", line)
	}
	if line := progressText(r, time.Now()); line != "" {
		fmt.Fprintf(tw, "progress\t%s\n", line)
	}
	fmt.Fprintf(tw, "created\t%s\n", r.CreatedAt.Local().Format(time.DateTime))
	if r.Report != "" {
		fmt.Fprintf(tw, "report\t%s\n", r.Report)
	}
	if r.Evidence != "" {
		fmt.Fprintf(tw, "evidence\t%s (pods' logs, statuses and events, kept before the teardown)\n", r.Evidence)
	}
	_ = tw.Flush()
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
	if r.Result != nil {
		for _, c := range r.Result.Checkpoints {
			fmt.Fprintf(w, "checkpoint  %s  step %d  epoch %g\n", c.URI, c.Step, c.Epoch)
		}
	}
}

// CheckText is what the data check found, in one line: "running (RayJob
// x)" until it has a verdict, then its rows, lengths, steps and estimate, or
// why it refused the run.
func CheckText(r *runs.Record) string {
	c := r.Check
	switch {
	case c == nil:
		return ""
	case c.Result == nil:
		return "running (RayJob " + c.RayJob + ")"
	case !c.Result.OK:
		return "refused: " + c.Result.Reason
	}
	res := c.Result
	var parts []string
	if n := res.Rows; n != nil {
		parts = append(parts, fmt.Sprintf("%d rows (%d train, %d held out, %d left out)", n.Total, n.Train, n.Eval, n.LeftOut))
	}
	if t := res.Tokens; t != nil {
		parts = append(parts, fmt.Sprintf("tokens p50 %d p90 %d max %d of %d", t.P50, t.P90, t.Max, t.MaxSeqLength))
	}
	if st := res.Steps; st != nil {
		parts = append(parts, fmt.Sprintf("%d steps", st.Total))
	}
	if e := res.Estimate; e != nil {
		parts = append(parts, fmt.Sprintf("about %s, %.1f GPU-hours, $%.2f", time.Duration(e.Seconds*float64(time.Second)).Round(time.Second), e.GPUHours, e.USD))
	}
	return "passed: " + strings.Join(parts, " · ")
}

// startupText is how the current attempt's workers came up, "2m27s:
// nodes 2m1s, image 26s", once the monitor has seen them all run.
func startupText(r *runs.Record) string {
	a := r.CurrentAttempt()
	if a == nil {
		return ""
	}
	if p, ok := a.StartupParts(); ok {
		return p.Text()
	}
	return ""
}

// capacityText is "tier 2 of 3 (spot) since 10:04:05 · 1 preemption" for
// the current attempt; "" for a run without one or on the only tier with
// no preemption.
func capacityText(r *runs.Record) string {
	a := r.CurrentAttempt()
	if a == nil || r.Spec == nil {
		return ""
	}
	tiers := r.Spec.Tiers()
	_, preempted := r.Lost()
	if len(tiers) < 2 && preempted == 0 {
		return ""
	}
	t := r.Spec.Tier(a.Tier)
	s := fmt.Sprintf("tier %d of %d (%s) since %s", a.Tier+1, len(tiers), t.Name(), a.Since().Local().Format(time.TimeOnly))
	switch preempted {
	case 0:
	case 1:
		s += " · 1 attempt lost to preemption"
	default:
		s += fmt.Sprintf(" · %d attempts lost to preemption", preempted)
	}
	return s
}

// oneRun parses the arguments of a command that takes one run ID, opens
// the state bucket and reads the run. When it cannot, it has said why and
// returns the exit code with ok false; otherwise the caller calls done.
func oneRun(ctx context.Context, e *env, name string, fs *flag.FlagSet, t *target, args []string) (st *runs.Store, r *runs.Record, done func(), code int, ok bool) {
	st, r, _, done, code, ok = lookup(ctx, e, name, fs, t, args, false)
	return st, r, done, code, ok
}

// oneRunOrSweep is oneRun that finds a sweep (sw) when no run has the ID.
func oneRunOrSweep(ctx context.Context, e *env, name string, fs *flag.FlagSet, t *target, args []string) (st *runs.Store, r *runs.Record, sw *sweeps.Record, done func(), code int, ok bool) {
	return lookup(ctx, e, name, fs, t, args, true)
}

// lookup is oneRun, and with orSweep oneRunOrSweep.
func lookup(ctx context.Context, e *env, name string, fs *flag.FlagSet, t *target, args []string, orSweep bool) (st *runs.Store, r *runs.Record, sw *sweeps.Record, done func(), code int, ok bool) {
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return nil, nil, nil, nil, code, false
	}
	if len(pos) != 1 {
		what := "run ID"
		if orSweep {
			what = "run or sweep ID"
		}
		fmt.Fprintf(e.stderr, "raydrop %s: give one %s\n", name, what)
		return nil, nil, nil, nil, ExitUsage, false
	}
	st, done, err := t.store(ctx)
	if err != nil {
		return nil, nil, nil, nil, fail(e, name, err), false
	}
	r, err = getRun(ctx, st, pos[0], t)
	if orSweep && errors.Is(err, errNoRun) {
		sw, err = getSweep(ctx, t, pos[0])
	}
	if err != nil {
		done()
		return nil, nil, nil, nil, fail(e, name, err), false
	}
	return st, r, sw, done, ExitOK, true
}

func runCancel(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "cancel")
	_, r, sw, done, code, ok := oneRunOrSweep(ctx, e, "cancel", fs, t, args)
	if !ok {
		return code
	}
	defer done()
	if sw != nil {
		return cancelSweep(ctx, e, t, sw)
	}
	if r.Phase.Terminal() {
		return fail(e, "cancel", fmt.Errorf("run %s has already ended %s", r.RunID, r.Phase))
	}
	w := t.client.Bucket(t.bucket).Object("cancel/" + r.RunID).NewWriter(ctx)
	if err := w.Close(); err != nil {
		return fail(e, "cancel", friendly(err, t))
	}
	fmt.Fprintf(e.stdout, "cancellation of %s requested\n", r.RunID)
	return ExitOK
}

func runMigrateState(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "migrate-state")
	if _, code, ok := parse(e, fs, args); !ok {
		return code
	}
	if t.state == "" || t.state == t.bucket {
		return fail(e, "migrate-state", errors.New("nothing to migrate: name the state bucket with --state-bucket or RAYDROP_STATE_BUCKET, different from the intake bucket"))
	}
	_, done, err := t.store(ctx)
	if err != nil {
		return fail(e, "migrate-state", err)
	}
	defer done()
	copied, present, err := runs.MigrateState(ctx, t.client.Bucket(t.bucket), t.client.Bucket(t.state))
	if err != nil {
		return fail(e, "migrate-state", friendly(err, t))
	}
	fmt.Fprintf(e.stdout, "copied %d objects from gs://%s to gs://%s (%d were there already)\n", copied, t.bucket, t.state, present)
	return ExitOK
}

// imageText is what the run's Ray containers run: the deployment's trainer
// image by digest, or the images its spec named (their runtime env
// installing the trainer's requirements).
// modelText is the base model's line: its revision pinned by commit, and
// where the workers read it.
func modelText(r *runs.Record) string {
	m := r.Model
	if m == nil {
		return ""
	}
	var how string
	switch {
	case m.Staged:
		how = "staged already by " + m.StagedBy
	case m.StagedBy == r.RunID:
		how = "staged by this run from the Hub"
	default:
		how = "being staged by " + m.StagedBy
	}
	return fmt.Sprintf("%s@%s (revision %s), read from %s, %s", m.Repo, m.Commit, m.Revision, m.URI, how)
}

func imageText(r *runs.Record) string {
	if r.Spec == nil {
		return ""
	}
	if r.TrainerImage != "" {
		return r.TrainerImage + " (the deployment's trainer image: nothing installed at start)"
	}
	head, workers := r.Spec.Cluster.HeadImage(), r.Spec.Cluster.WorkerImage()
	return "head " + head + ", workers " + workers + " (the runtime env pip-installs the trainer's requirements)"
}

// stallLine says the current attempt's suspected stall, or that it moved
// on since; "" when it has none.
func stallLine(r *runs.Record) string {
	a := r.CurrentAttempt()
	if a == nil || a.Stall == nil {
		return ""
	}
	s := a.Stall
	if s.ClearedAt != nil {
		return fmt.Sprintf("suspected at %s, cleared at %s: the ranks moved on (%s)", s.SuspectedAt.UTC().Format(time.TimeOnly), s.ClearedAt.UTC().Format(time.TimeOnly), s.Summary())
	}
	return fmt.Sprintf("suspected since %s: %s", s.SuspectedAt.UTC().Format(time.TimeOnly), s.Summary())
}
