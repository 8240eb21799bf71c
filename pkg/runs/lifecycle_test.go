package runs

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/spec"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// inPhase is a record in phase p, as the pipeline would have left it: an
// attempt from PROVISIONED on, an outcome from FINISHING on.
func inPhase(p Phase) *Record {
	r := &Record{RunID: "r", Phase: p, Cluster: "c", Times: map[Phase]time.Time{p: t0}}
	switch p {
	case Accepted, Queued, Rejected:
	case Checking:
		r.Check = &DataCheck{RayJob: "r-0", CreatedAt: t0}
	default:
		r.Attempt = 1
		r.Attempts = []Attempt{{N: 1, RayJob: "r-1", CreatedAt: t0}}
	}
	if p == Finishing || p.Terminal() {
		r.Outcome = OutcomeSucceeded
	}
	return r
}

var done = &checkpoints.Result{Latest: &checkpoints.Checkpoint{Name: "checkpoint_000000"}}

// mark makes each transition the way the handlers do. A transition added to
// the lifecycle without an entry here fails TestEveryTransitionIsTested.
var mark = map[Transition]func(r *Record) error{
	ToQueued:   func(r *Record) error { return r.MarkQueued("other", t0) },
	ToChecking: func(r *Record) error { return r.MarkChecking("r-0", t0) },
	ToProvisioned: func(r *Record) error {
		return r.MarkProvisioned(Attempt{N: r.Attempt + 1, RayJob: "next"}, "lost", t0)
	},
	ToSubmitted: func(r *Record) error { return r.MarkSubmitted(r.Attempt, t0) },
	ToRunning:   func(r *Record) error { return r.MarkRunning(r.Attempt, t0) },
	ToFinishing: func(r *Record) error {
		return r.MarkFinishing(r.Attempt, Ending{Outcome: OutcomeCancelled, Reason: ReasonCancelled, Message: "asked"}, t0)
	},
	ToEnded: func(r *Record) error { return r.MarkEnded(done, nil, t0) },
}

// lands is the phase each transition moves a run to (an ending as decided).
var lands = map[Transition]Phase{
	ToQueued: Queued, ToChecking: Checking, ToProvisioned: Provisioned, ToSubmitted: Submitted,
	ToRunning: Running, ToFinishing: Finishing, ToEnded: Succeeded,
}

func TestEveryTransitionIsTested(t *testing.T) {
	for tr := range Transitions() {
		if mark[tr] == nil || lands[tr] == "" {
			t.Errorf("transition %s has no test", tr)
		}
	}
}

// TestTransitions makes every transition from every phase: it moves the
// run exactly when the lifecycle allows it, and a refusal changes nothing.
func TestTransitions(t *testing.T) {
	for tr, from := range Transitions() {
		if mark[tr] == nil {
			continue // TestEveryTransitionIsTested reports it
		}
		for _, p := range Phases() {
			r := inPhase(p)
			before := inPhase(p)
			err := mark[tr](r)
			allowed := slices.Contains(from, p)
			switch {
			case allowed && err != nil:
				t.Errorf("%s from %s: %v, want allowed", tr, p, err)
			case allowed && r.Phase != lands[tr]:
				t.Errorf("%s from %s landed in %s, want %s", tr, p, r.Phase, lands[tr])
			case allowed && (len(r.History) != 1 || r.History[0].Phase != r.Phase):
				t.Errorf("%s from %s: history %v", tr, p, r.History)
			case !allowed && (!IsRefused(err) || !errors.Is(err, ErrNoChange)):
				t.Errorf("%s from %s: %v, want a refusal that leaves the record as is", tr, p, err)
			case !allowed && !reflect.DeepEqual(r, before):
				t.Errorf("%s from %s was refused but changed the record: %+v", tr, p, r)
			}
		}
	}
}

// TestLifecycleShape: a terminal phase is left by no transition; every
// other phase can be ended (cancelled or failed) or is FINISHING; every
// phase is met by a run (a transition lands there, or a record starts there).
func TestLifecycleShape(t *testing.T) {
	// MarkEnded lands in the phase of the ending decided (TestEndingsLand).
	reached := map[Phase]bool{Accepted: true, Rejected: true, Failed: true, Cancelled: true, Stopped: true}
	for tr, to := range lands {
		reached[to] = true
		for _, p := range Transitions()[tr] {
			if p.Terminal() {
				t.Errorf("transition %s leaves terminal phase %s", tr, p)
			}
		}
	}
	for _, p := range Phases() {
		if !reached[p] {
			t.Errorf("no run can reach phase %s", p)
		}
		if !p.Terminal() && p != Finishing && !slices.Contains(Transitions()[ToFinishing], p) {
			t.Errorf("a run in phase %s can never be cancelled or fail: add it to %s's phases", p, ToFinishing)
		}
		if e := p.Event(); e != "" {
			if q, ok := PhaseOfEvent(e); !ok || q != p {
				t.Errorf("event %s maps to %s, want %s", e, q, p)
			}
		}
	}
	if _, ok := PhaseOfEvent("provisioned"); ok {
		t.Error("PROVISIONED has no public event")
	}
}

// TestAttemptsMustFollow: a step for another attempt than the current one
// is refused, and so is a retry that skips an attempt.
func TestAttemptsMustFollow(t *testing.T) {
	for name, f := range map[string]func() error{
		"submit a stale attempt":   func() error { return inPhase(Provisioned).MarkSubmitted(2, t0) },
		"run a stale attempt":      func() error { return inPhase(Submitted).MarkRunning(0, t0) },
		"finish a stale attempt":   func() error { return inPhase(Running).MarkFinishing(2, Ending{Outcome: OutcomeSucceeded}, t0) },
		"retry skipping attempt 2": func() error { return inPhase(Running).MarkProvisioned(Attempt{N: 3}, "lost", t0) },
		"first attempt not 1":      func() error { return inPhase(Queued).MarkProvisioned(Attempt{N: 2}, "", t0) },
	} {
		if err := f(); !IsRefused(err) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
	if err := inPhase(Running).MarkFinishing(1, Ending{Outcome: OutcomeFailed}, t0); err == nil || IsRefused(err) {
		t.Errorf("a failure without a reason: %v, want an error that is not a mere refusal", err)
	}
}

// TestRetryEndsThePreviousAttempt: a retry records why the attempt it
// replaces ended, and the new attempt starts at once.
func TestRetryEndsThePreviousAttempt(t *testing.T) {
	r := inPhase(Running)
	at := t0.Add(time.Hour)
	if err := r.MarkProvisioned(Attempt{N: 2, RayJob: "r-2", ResumeFrom: "gs://b/ck"}, "RayJob lost", at); err != nil {
		t.Fatal(err)
	}
	prev, cur := r.Attempts[0], r.CurrentAttempt()
	if prev.Outcome != OutcomeRetried || prev.Reason != InfrastructureFailure || prev.Message != "RayJob lost" || !prev.EndedAt.Equal(at) {
		t.Errorf("previous attempt %+v", prev)
	}
	if r.Attempt != 2 || cur.N != 2 || !cur.CreatedAt.Equal(at) || cur.ResumeFrom != "gs://b/ck" {
		t.Errorf("attempt %d, current %+v", r.Attempt, cur)
	}
}

func TestMarkEnded(t *testing.T) {
	denied := errors.New("403 Forbidden")
	for _, c := range []struct {
		outcome    Outcome
		res        *checkpoints.Result
		unreadable error
		phase      Phase
		reason     Reason
	}{
		{OutcomeSucceeded, done, nil, Succeeded, ""},
		{OutcomeSucceeded, &checkpoints.Result{}, nil, Failed, NoCheckpoint},
		{OutcomeFailed, done, nil, Failed, DeadlineExceeded},
		{OutcomeCancelled, &checkpoints.Result{}, nil, Cancelled, ReasonCancelled},
		{OutcomeSucceeded, &checkpoints.Result{}, denied, Failed, CheckpointsUnreadable},
		{OutcomeFailed, &checkpoints.Result{}, denied, Failed, CheckpointsUnreadable},
		{OutcomeCancelled, &checkpoints.Result{}, denied, Cancelled, ReasonCancelled}, // a cancelled run stays cancelled
	} {
		r := inPhase(Finishing)
		r.Outcome = c.outcome
		if c.outcome != OutcomeSucceeded {
			r.Reason = c.reason
		}
		if err := r.MarkEnded(c.res, c.unreadable, t0); err != nil || r.Phase != c.phase || r.Reason != c.reason || r.Result != c.res {
			t.Errorf("%s: %v, phase %s reason %s; want %s %s", c.outcome, err, r.Phase, r.Reason, c.phase, c.reason)
		}
		if !r.Unannounced() {
			t.Errorf("%s: an ended run is unannounced until its event goes out", c.outcome)
		}
	}
}

func TestNewRecord(t *testing.T) {
	s := &spec.JobSpec{}
	s.Cluster.Name, s.Cluster.Namespace = "c", "ns"
	r := NewRecord("id", "src", "fallback", s, nil, t0)
	if r.Phase != Accepted || r.Name != "fallback" || r.Cluster != "c" || r.SpecHash == "" || !r.Times[Accepted].Equal(t0) {
		t.Errorf("accepted record %+v", r)
	}
	r = NewRecord("id", "src", "bad", nil, spec.Problems{{Path: "training.epochs", Message: "must be at least 1"}}, t0)
	if r.Phase != Rejected || r.Reason != InvalidSpec || r.Message == "" || len(r.Problems) != 1 || !r.Unannounced() {
		t.Errorf("rejected record %+v", r)
	}
}

func TestCancelRequest(t *testing.T) {
	r := inPhase(Queued)
	if err := r.MarkCancelRequested(); err != nil || !r.CancelRequested {
		t.Fatalf("%v, %v", err, r.CancelRequested)
	}
	if err := r.MarkCancelRequested(); !errors.Is(err, ErrNoChange) {
		t.Errorf("second request: %v, want no change", err)
	}
	if err := inPhase(Succeeded).MarkCancelRequested(); !errors.Is(err, ErrNoChange) {
		t.Errorf("ended run: %v, want no change", err)
	}
}

// TestDurations: every entry into a phase counts; the terminal phase does
// not.
func TestDurations(t *testing.T) {
	r := &Record{}
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for i, p := range []Phase{Accepted, Provisioned, Submitted, Running, Provisioned, Submitted, Running, Finishing, Succeeded} {
		r.enter(p, at([]int{0, 1, 2, 5, 65, 66, 76, 106, 107}[i]))
	}
	got := r.Durations(at(107))
	want := map[Phase]time.Duration{Accepted: time.Minute, Provisioned: 2 * time.Minute, Submitted: 13 * time.Minute, Running: 90 * time.Minute, Finishing: time.Minute}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("durations %v, want %v", got, want)
	}
	if !r.Times[Provisioned].Equal(at(1)) {
		t.Errorf("Times keeps the first entry: %v", r.Times[Provisioned])
	}
}

// TestDataCheckBeforeTheFirstAttempt: a checked run keeps its check's
// verdict, and only its first attempt follows the check.
func TestDataCheckBeforeTheFirstAttempt(t *testing.T) {
	r := inPhase(Accepted)
	if err := r.MarkChecking("r-0", t0); err != nil || r.Phase != Checking || r.Check.RayJob != "r-0" {
		t.Fatalf("MarkChecking: %v, %+v", err, r)
	}
	if !r.NoteCheck(&checkpoints.DataCheck{OK: true}, t0) || r.NoteCheck(&checkpoints.DataCheck{Reason: "InvalidData"}, t0) {
		t.Error("NoteCheck records a verdict once")
	}
	if err := r.MarkProvisioned(Attempt{N: 2}, "", t0); !IsRefused(err) {
		t.Errorf("attempt 2 after the check: %v, want refused", err)
	}
	if err := r.MarkProvisioned(Attempt{N: 1, RayJob: "r-1"}, "", t0); err != nil || r.Phase != Provisioned || !r.Check.Result.OK {
		t.Errorf("attempt 1 after the check: %v, %+v", err, r)
	}
}

// TestEndingsLand: a finishing run ends in the phase of its outcome; a
// stopped trial keeps what it found, and one whose results cannot be read
// fails as any run would.
func TestEndingsLand(t *testing.T) {
	res := &checkpoints.Result{Latest: &checkpoints.Checkpoint{URI: "gs://b/c"}}
	for outcome, want := range map[Outcome]Phase{OutcomeSucceeded: Succeeded, OutcomeFailed: Failed, OutcomeCancelled: Cancelled, OutcomeStopped: Stopped} {
		r := inPhase(Running)
		e := Ending{Outcome: outcome, Reason: map[Outcome]Reason{OutcomeFailed: ApplicationError, OutcomeCancelled: ReasonCancelled, OutcomeStopped: EarlyStopped}[outcome]}
		if err := r.MarkFinishing(r.Attempt, e, t0); err != nil {
			t.Fatalf("%s: %v", outcome, err)
		}
		if err := r.MarkEnded(res, nil, t0); err != nil || r.Phase != want {
			t.Errorf("%s ends %s (%v), want %s", outcome, r.Phase, err, want)
		}
	}
	r := inPhase(Running)
	_ = r.MarkFinishing(r.Attempt, Ending{Outcome: OutcomeStopped, Reason: EarlyStopped}, t0)
	if err := r.MarkEnded(res, errors.New("403"), t0); err != nil || r.Phase != Failed || r.Reason != CheckpointsUnreadable {
		t.Errorf("a stopped trial with unreadable results ends %s (%s), %v", r.Phase, r.Reason, err)
	}
}

// TestUseImages: admission gives every container the spec names no image
// the deployment's trainer image, and records it as the run's only when
// the head and the workers both run it; without one, nothing changes (the
// stock images, with pip).
func TestUseImages(t *testing.T) {
	const trainer = "r.example/raydrop/trainer@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tt := range []struct {
		name                 string
		head, workers, image string
		wantHead, wantWorker string
		wantTrainer          string
	}{
		{"both unnamed", "", "", trainer, trainer, trainer, trainer},
		{"workers named", "", "my/ray:gpu", trainer, trainer, "my/ray:gpu", ""},
		{"both named the trainer image", trainer, trainer, trainer, trainer, trainer, trainer},
		{"no trainer image", "", "", "", "rayproject/ray:2.48.0", "rayproject/ray:2.48.0-gpu", ""},
		{"stock named", "rayproject/ray:2.48.0", "rayproject/ray:2.48.0-gpu", trainer, "rayproject/ray:2.48.0", "rayproject/ray:2.48.0-gpu", ""},
	} {
		s := spec.Defaults()
		s.Cluster.Head.Image, s.Cluster.Workers.Image = tt.head, tt.workers
		r := &Record{Spec: &s}
		r.UseImages(tt.image)
		if got := [3]string{s.Cluster.HeadImage(), s.Cluster.WorkerImage(), r.TrainerImage}; got != [3]string{tt.wantHead, tt.wantWorker, tt.wantTrainer} {
			t.Errorf("%s: head, workers, trainer image = %q, want %q", tt.name, got, [3]string{tt.wantHead, tt.wantWorker, tt.wantTrainer})
		}
	}
}

// TestNoteStarted: the tier and start-up of an attempt are recorded until
// it is recorded running, the start-up once; its trainer's first report
// once, for that attempt only.
func TestNoteStarted(t *testing.T) {
	s := &Startup{ScheduledAt: t0.Add(90 * time.Second), StartedAt: t0.Add(2 * time.Minute)}
	r := inPhase(Submitted)
	r.Attempt = 1
	if !r.NoteStarted(1, 2, s) || r.CurrentAttempt().Tier != 2 || r.CurrentAttempt().Startup != s {
		t.Fatalf("attempt after NoteStarted: %+v", r.CurrentAttempt())
	}
	if r.NoteStarted(1, 2, &Startup{}) || r.CurrentAttempt().Startup != s {
		t.Errorf("a second start-up replaced the first: %+v", r.CurrentAttempt().Startup)
	}
	if r.NoteStarted(2, 3, nil) {
		t.Errorf("another attempt's tier was recorded")
	}
	if err := r.MarkRunning(1, t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if r.NoteStarted(1, 3, nil) || r.CurrentAttempt().Tier != 2 {
		t.Errorf("a running attempt's tier moved: %+v", r.CurrentAttempt())
	}
	if r.NoteFirstReport(2, &t0, nil) || r.CurrentAttempt().FirstReportAt != nil {
		t.Errorf("another attempt's first report was recorded")
	}
	first := t0.Add(4 * time.Minute)
	su := &checkpoints.TrainerStartup{StartedAt: 100, WeightsSeconds: 1, DataSeconds: 2, FirstStepAt: 110}
	if !r.NoteFirstReport(1, &first, su) || r.NoteFirstReport(1, &t0, nil) || !r.CurrentAttempt().FirstReportAt.Equal(first) || *r.CurrentAttempt().TrainerStartup != *su {
		t.Errorf("first report %v (%+v), want %v (%+v), recorded once", r.CurrentAttempt().FirstReportAt, r.CurrentAttempt().TrainerStartup, first, su)
	}
	r2 := inPhase(Running)
	r2.Attempt = 1
	if !r2.NoteFirstReport(1, &first, &checkpoints.TrainerStartup{StartedAt: 100, FirstStepAt: 90}) || r2.CurrentAttempt().TrainerStartup != nil {
		t.Errorf("an account whose first step comes before its start was recorded: %+v", r2.CurrentAttempt().TrainerStartup)
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// TestStartupParts: the start-up splits from the attempt's creation into
// the wait for nodes, the image pull, and the time to the trainer's first
// report once it made one; workers that came up before the attempt count
// nothing.
func TestStartupParts(t *testing.T) {
	f := func(s float64) *float64 { return &s }
	up := &Startup{ScheduledAt: t0.Add(90 * time.Second), StartedAt: t0.Add(2 * time.Minute)}
	first := t0.Add(3 * time.Minute)
	tests := []struct {
		name  string
		a     Attempt
		want  StartupParts
		total float64
		text  string
	}{
		{"nodes, then the image", Attempt{CreatedAt: t0, Startup: up}, StartupParts{Nodes: 90, Image: 30}, 120, "2m0s: nodes 1m30s, image 30s"},
		{"and the first report", Attempt{CreatedAt: t0, Startup: up, FirstReportAt: &first}, StartupParts{Nodes: 90, Image: 30, FirstStep: f(60)}, 180, "3m0s: nodes 1m30s, image 30s, to the first step 1m0s"},
		{"scheduled before the attempt", Attempt{CreatedAt: t0.Add(100 * time.Second), Startup: up}, StartupParts{Image: 20}, 20, "20s: nodes 0s, image 20s"},
		{"workers kept from before", Attempt{CreatedAt: t0.Add(150 * time.Second), Startup: up, FirstReportAt: &first}, StartupParts{FirstStep: f(30)}, 30, "30s: nodes 0s, image 0s, to the first step 30s"},
		// The trainer's account: its function began 12 s after the
		// containers, took 20 s for the weights and 5 s for the data, and
		// ended its first step 45 s after the containers started (before
		// its first report, a minute after).
		{"the trainer's account", Attempt{CreatedAt: t0, Startup: up, FirstReportAt: &first, TrainerStartup: &checkpoints.TrainerStartup{
			StartedAt: unix(up.StartedAt.Add(12 * time.Second)), WeightsSeconds: 20, DataSeconds: 5, FirstStepAt: unix(up.StartedAt.Add(45 * time.Second))}},
			StartupParts{Nodes: 90, Image: 30, FirstStep: f(45), Trainer: &TrainerParts{RuntimeEnv: 12, Weights: 20, Data: 5, Steps: 8}}, 165,
			"2m45s: nodes 1m30s, image 30s, to the first step 45s (runtime env 12s, weights 20s, data 5s, first step 8s)"},
		// The driver staged the model for 10 of those 12 s: weights, not
		// Ray's runtime env.
		{"the driver staged the model", Attempt{CreatedAt: t0, Startup: up, FirstReportAt: &first, TrainerStartup: &checkpoints.TrainerStartup{
			StartedAt: unix(up.StartedAt.Add(12 * time.Second)), WeightsSeconds: 20, DataSeconds: 5, FirstStepAt: unix(up.StartedAt.Add(45 * time.Second)), StageSeconds: 10}},
			StartupParts{Nodes: 90, Image: 30, FirstStep: f(45), Trainer: &TrainerParts{RuntimeEnv: 2, Weights: 30, Data: 5, Steps: 8}}, 165,
			"2m45s: nodes 1m30s, image 30s, to the first step 45s (runtime env 2s, weights 30s, data 5s, first step 8s)"},
	}
	for _, tt := range tests {
		p, ok := tt.a.StartupParts()
		if !ok || !reflect.DeepEqual(p, tt.want) || p.Total() != tt.total || p.Text() != tt.text {
			t.Errorf("%s: %+v (%v) total %v %q, want %+v total %v %q", tt.name, p, ok, p.Total(), p.Text(), tt.want, tt.total, tt.text)
		}
	}
	if _, ok := (&Attempt{CreatedAt: t0, FirstReportAt: &first}).StartupParts(); ok {
		t.Error("an attempt whose workers were not seen has start-up parts")
	}
}

// TestUnannouncedUntilReported: an ended run with a spec is unannounced
// until its terminal event and then its report's (report_ready) have gone
// out, or until it is known to have no report; a run rejected at intake
// owes its terminal event only.
func TestUnannouncedUntilReported(t *testing.T) {
	withSpec := func(published []Phase, noReport string) *Record {
		r := inPhase(Succeeded)
		r.Spec = &spec.JobSpec{}
		r.NoReport = noReport
		for _, p := range published {
			r.MarkPublished(p)
		}
		return r
	}
	rejected := NewRecord("id", "src", "bad", nil, spec.Problems{{Path: "training.epochs", Message: "must be at least 1"}}, t0)
	rejected.MarkPublished(Rejected)
	for _, c := range []struct {
		name              string
		r                 *Record
		unannounced, owed bool
	}{
		{"nothing out", withSpec(nil, ""), true, true},
		{"the terminal event out, the report owed", withSpec([]Phase{Succeeded}, ""), true, true},
		{"both out", withSpec([]Phase{Succeeded, ReportReady}, ""), false, false},
		{"the terminal event out, no report for good", withSpec([]Phase{Succeeded}, "403 Forbidden"), false, false},
		{"a rejected run, announced", rejected, false, false},
		{"a running run", inPhase(Running), false, false},
	} {
		if got, owed := c.r.Unannounced(), c.r.ReportOwed(); got != c.unannounced || owed != c.owed {
			t.Errorf("%s: unannounced %v, report owed %v; want %v, %v", c.name, got, owed, c.unannounced, c.owed)
		}
	}
	if ReportReady.Known() || ReportReady.Terminal() || ReportReady.Event() != "report_ready" {
		t.Errorf("ReportReady: known %v, terminal %v, event %q; want an event of no phase", ReportReady.Known(), ReportReady.Terminal(), ReportReady.Event())
	}
	if p, ok := PhaseOfEvent("report_ready"); !ok || p != ReportReady {
		t.Errorf("PhaseOfEvent(report_ready) = %s, %v", p, ok)
	}
}
