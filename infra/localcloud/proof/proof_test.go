package proof_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/proof"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

const output = "raydrop-proof-checkpoints"

// tick is the local scheduler's interval.
const tick = 2 * time.Second

// A run stalled by a crash goes on within the pipeline's recovery bound
// (runs.RecoveryBound: StaleStep plus a tick). The suite waits that
// bound plus recoveryMargin, which covers what the bound leaves out on this
// machine: the sweep itself and the deliveries queued behind the other
// scenarios' (the emulator pushes two at a time per subscription).
var recoveryBound = runs.RecoveryBound(tick)

const recoveryMargin = 15 * time.Second

// token is the Hugging Face token planted in the local Secret; it must
// never appear in an event, a record or a log.
const token = "hf_PlantedProofToken7Qx2Vb9Lm4Np8Rs3Tw6Yz1"

var (
	st      *stack.Stack
	evs     *probe.Events
	jobs    *probe.RayJobs
	ray     rayclient.Interface
	kube    kubernetes.Interface
	example []byte
	report  = &proof.Report{}
	dups    = newCopies()
)

// TestMain starts one local cloud for the suite, plants the token, runs the
// scenarios and prints the per-scenario report (and writes it as JSON to
// $RAYDROP_PROOF_REPORT when set).
func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	code := func() int {
		defer cancel()
		dir, err := os.MkdirTemp("", "raydrop-proof-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		logf, err := os.Create(filepath.Join(dir, "localcloud.log"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = logf.Close() }()
		st, err = stack.Start(ctx, stack.Options{
			Repo: "../../..", StateDir: dir, Tick: tick, OutputBuckets: []string{output, unreadableOutput},
			DefaultSim: "steps=2,step=200ms", Progress: os.Stderr,
			Log: slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "start local cloud: %v\n", err)
			return 1
		}
		failed := true
		defer func() {
			st.Stop()
			if !failed {
				_ = os.RemoveAll(dir)
			} else {
				fmt.Fprintf(os.Stderr, "local cloud logs kept in %s\n", dir)
			}
		}()
		if err := setup(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		code := m.Run()
		fmt.Fprintln(os.Stderr, "\nproof report:")
		report.Print(os.Stderr)
		if path := os.Getenv("RAYDROP_PROOF_REPORT"); path != "" {
			var table strings.Builder
			report.Print(&table)
			if err := errors.Join(report.Write(path), os.WriteFile(strings.TrimSuffix(path, ".json")+".txt", []byte(table.String()), 0o644)); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
		failed = code != 0
		return code
	}()
	os.Exit(code)
}

func setup(ctx context.Context) error {
	var err error
	if ray, err = rayclient.NewForConfig(st.Sim.Config); err != nil {
		return err
	}
	if kube, err = kubernetes.NewForConfig(st.Sim.Config); err != nil {
		return err
	}
	if example, err = os.ReadFile("../../../examples/gemma3-vision.json"); err != nil {
		return err
	}
	if evs, err = probe.TapEvents(ctx, st, "proof-events"); err != nil {
		return err
	}
	if jobs, err = probe.WatchRayJobs(ctx, ray); err != nil {
		return err
	}
	st.Adapter.Observe(func(d eventarc.Delivery) {
		observe(d)
		dups.seen(d)
	})
	// The Secret every spec's hfSecret names by default, as a user would
	// create it on GKE.
	_, err = kube.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "hf-secret"},
		StringData: map[string]string{"hf_api_token": token},
	}, metav1.CreateOptions{})
	return err
}

// TestProof runs the scenarios: first those that break shared parts (crashes,
// the API server) one after another, then the rest side by side, then the
// search for the planted token over everything they left.
func TestProof(t *testing.T) {
	t.Run("crash", testCrashes)
	t.Run("apiserver", testAPIServer)
	t.Run("propagating", testGrantsPropagating)
	t.Run("concurrent", func(t *testing.T) {
		t.Run("duplicates", testDuplicates)
		t.Run("lost", testLostMessages)
		t.Run("badinput", testBadInput)
		t.Run("permissions", testPermissions)
		t.Run("outside-grant", testOutsideGrant)
		t.Run("capacity", testCapacity)
	})
	t.Run("shell", testNothingReachesAShell)
	t.Run("secrets", testSecrets)
	t.Run("processes", func(t *testing.T) {
		exits := st.Exits()
		if len(exits) > 0 {
			t.Errorf("function processes died on their own: %v", exits)
			report.Add("processes", 0, 0, exits...)
		}
		for _, fn := range stack.Functions {
			report.Note("crash "+fn, fmt.Sprintf("%s restarted %d times after the kills; %d process exits not caused by a kill", fn, st.Restarts(fn), len(exits)))
		}
	})
	t.Run("deadletters", attributeDeadLetters)
	t.Run("refusals", auditRefusals)
}

// owners maps what identifies a trial's messages (a run ID, an object
// name) to its scenario, for the dead-letter count.
var owners sync.Map

func own(key, scenario string) {
	if key != "" {
		owners.Store(key, scenario)
	}
}

// attributeDeadLetters takes every dead-lettered message and counts it
// against the scenario whose run or object it names.
func attributeDeadLetters(t *testing.T) {
	for _, trigger := range st.RouteNames {
		if _, err := st.PubSub.DeadLettered(context.Background(), trigger); err != nil {
			t.Fatal(err)
		}
		for _, m := range st.PubSub.DeadLetteredMessages(trigger) {
			text := string(m.GetData()) + fmt.Sprint(m.GetAttributes())
			scenario := "unattributed"
			owners.Range(func(k, v any) bool {
				if strings.Contains(text, k.(string)) {
					scenario = v.(string)
					return false
				}
				return true
			})
			report.DeadLettered(scenario, 1)
			report.Note(scenario, fmt.Sprintf("dead-lettered from %s: %.200s", trigger, text))
		}
	}
}

// spec is the example on its own cluster with overrides merged in.
func spec(t *testing.T, cluster string, extra map[string]any) []byte {
	t.Helper()
	b, err := probe.Spec(example, cluster, output, extra)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// request publishes a spec to the requests topic.
func request(t *testing.T, data []byte) string {
	t.Helper()
	return requestWith(t, data, nil)
}

func requestWith(t *testing.T, data []byte, attrs map[string]string) string {
	t.Helper()
	ctx := context.Background()
	pub := st.PS.Publisher(stack.Topics.Requests)
	defer pub.Stop()
	id, err := pub.Publish(ctx, &pubsub.Message{Data: data, Attributes: attrs}).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func upload(t *testing.T, name string, data []byte, scenario string) string {
	t.Helper()
	id, err := probe.Upload(context.Background(), st, name, data, scenario)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// outcome is how a run must end.
type outcome struct {
	phase    runs.Phase
	attempts int           // RayJobs the run may create (default 1)
	limit    time.Duration // how long it may take (default 150 s and the recovery bound)
}

// checkRun waits for the run's end and records a trial of scenario: the run
// ended as want says, with one accepted and one terminal event, at most one
// RayJob per attempt, and no worker left on its cluster.
func checkRun(t *testing.T, scenario, runID, cluster string, want outcome) {
	t.Helper()
	if want.attempts == 0 {
		want.attempts = 1
	}
	if want.limit == 0 {
		want.limit = 150*time.Second + recoveryBound
	}
	own(runID, scenario)
	ctx := context.Background()
	var problems []string
	dups, orphans := 0, 0
	rec, err := probe.WaitPhase(ctx, st, runID, want.limit, probe.Ended...)
	if err != nil {
		problems = append(problems, err.Error())
		orphans++
	} else if rec.Phase != want.phase {
		problems = append(problems, fmt.Sprintf("run %s ended %s (%s), want %s", runID, rec.Phase, rec.Message, want.phase))
	}
	// The terminal event follows the run's end within the recovery bound,
	// even when the delivery that ended it died before announcing it.
	wait := recoveryBound + recoveryMargin
	if rec != nil {
		if ended, ok := rec.Times[rec.Phase]; ok {
			wait = max(time.Until(ended.Add(wait)), 0)
		}
	}
	seen, err := evs.WaitTerminal(runID, wait, 3*time.Second)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if n, notes := unexplainedCopies(seen, "terminal"); n > 0 {
		dups += n
		problems = append(problems, fmt.Sprintf("run %s: %d terminal events", runID, probe.Count(seen, "terminal")))
	} else {
		noteAll(scenario, notes)
	}
	// Then the report, written after the terminal event, and its own event,
	// exactly once however the deliveries died (a kill after the terminal
	// event and before the report included), unless the report may not be
	// written at all.
	if rec != nil && rec.Phase != runs.Rejected {
		if ann, err := probe.WaitAnnounced(ctx, st, runID, wait+recoveryBound); err != nil {
			problems = append(problems, err.Error())
		} else if ann.NoReport != "" {
			report.Note(scenario, fmt.Sprintf("run %s has no report: %s", runID, ann.NoReport))
		} else {
			if seen, err = evs.WaitReport(runID, 40*time.Second, 3*time.Second); err != nil {
				problems = append(problems, err.Error())
			}
			if n, notes := unexplainedCopies(seen, events.ReportReady); n > 0 {
				dups += n
				problems = append(problems, fmt.Sprintf("run %s: %d %s events", runID, probe.Count(seen, events.ReportReady), events.ReportReady))
			} else {
				noteAll(scenario, notes)
			}
			if e := probe.Report(seen); e != nil && (e.Report == "" || e.Report != ann.Report) {
				problems = append(problems, fmt.Sprintf("run %s: %s event names report %q, the record %q", runID, events.ReportReady, e.Report, ann.Report))
			}
		}
	}
	if want.phase != runs.Rejected && probe.Count(seen, "accepted") == 0 {
		// A message pulled on a stream that broke comes again once its ack
		// deadline (30 s) passes: Pub/Sub delivers at least once, not in
		// order. Wait that long before calling the event missing.
		seen = waitAccepted(scenario, runID, seen)
	}
	if want.phase != runs.Rejected {
		n, notes := unexplainedCopies(seen, "accepted")
		if c := probe.Count(seen, "accepted"); c == 0 || n > 0 {
			dups += n
			problems = append(problems, fmt.Sprintf("run %s: %d accepted events", runID, c))
		} else {
			noteAll(scenario, notes)
		}
	}
	created := jobs.Of(runID)
	if len(created) > want.attempts {
		dups += len(created) - want.attempts
		problems = append(problems, fmt.Sprintf("run %s: %d RayJobs created, want at most %d", runID, len(created), want.attempts))
	}
	names := map[string]int{}
	for _, c := range created {
		if names[c.Name]++; names[c.Name] == 2 {
			dups++
			problems = append(problems, fmt.Sprintf("run %s: RayJob %s created twice", runID, c.Name))
		}
	}
	if cluster != "" {
		if err := probe.WaitNoWorkers(ctx, kube, cluster, 60*time.Second); err != nil {
			orphans++
			problems = append(problems, err.Error())
		}
	}
	report.Add(scenario, dups, orphans, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}

// waitAccepted waits up to the tap's ack deadline and a margin for a run's
// accepted event, and notes it when it came late.
func waitAccepted(scenario, runID string, seen []probe.Seen) []probe.Seen {
	start := time.Now()
	for time.Since(start) < 35*time.Second {
		if now := evs.Of(runID); probe.Count(now, "accepted") > 0 {
			report.Note(scenario, fmt.Sprintf("run %s: accepted event arrived %.1f s after the terminal one (redelivered)", runID, time.Since(start).Seconds()))
			return now
		}
		time.Sleep(200 * time.Millisecond)
	}
	return seen
}

// runIDOf is the run ID a request without runId gets.
func runIDOf(messageID string) string {
	return names.RunIDFromMessage(stack.Topics.Requests, messageID)
}

func contains(haystack []byte, needle string) bool {
	return strings.Contains(string(haystack), needle)
}

// publishers are the functions that publish each phase's event.
var publishers = map[string][]string{
	"accepted":  {"Provision", "Monitor"}, // Monitor: the sweep re-admits a stalled run
	"rejected":  {"Provision", "Finalize"},
	"succeeded": {"Finalize"},
	"failed":    {"Finalize"},
	"stalled":   {"Monitor"},
	"cancelled": {"Finalize"},
	// The report's event follows the terminal one, from the same delivery
	// or a later one.
	events.ReportReady: {"Finalize"},
}

// killWindow is how far a kill may be from the arrival of the event it cut
// short: the event arrives after its publish, and the process was killed
// after the publish and before its next write.
const killWindow = 5 * time.Second

// unexplainedCopies counts the events of phase ("terminal": any terminal
// phase) beyond the first that no kill explains. Announce publishes an event
// and then records that it did; a process killed between the two (a kill
// ends every delivery it was handling, another lane's too) leaves its claim,
// and once the claim expires the next delivery publishes the same event
// again, under the same CloudEvent ID, by which subscribers drop it as they
// drop Pub/Sub's own redeliveries. Such a copy is explained, and noted; any
// other copy is a duplicate.
func unexplainedCopies(seen []probe.Seen, phase string) (n int, notes []string) {
	var got []probe.Seen
	for _, e := range seen {
		if probe.Count([]probe.Seen{e}, phase) == 1 {
			got = append(got, e)
		}
	}
	if len(got) < 2 {
		return 0, nil
	}
	first := got[0]
	for _, e := range got[1:] {
		if e.ID != first.ID {
			n++
			continue
		}
		k, ok := killedAround(first)
		if !ok {
			n++
			continue
		}
		notes = append(notes, fmt.Sprintf("event %s published again %.1f s later under the same CloudEvent ID: %s was killed %.1f s from the first copy's arrival (after %s), before it recorded the publish",
			first.ID, e.At.Sub(first.At).Seconds(), k.Function, k.At.Sub(first.At).Seconds(), k.After))
	}
	return n, notes
}

// killedAround finds a kill of a function that publishes e's phase close
// enough to e's arrival to have cut its publisher short.
func killedAround(e probe.Seen) (stack.Crash, bool) {
	for _, k := range st.Kills() {
		d := k.At.Sub(e.At)
		if slices.Contains(publishers[e.Phase], k.Function) && d > -killWindow && d < killWindow {
			return k, true
		}
	}
	return stack.Crash{}, false
}

func noteAll(scenario string, notes []string) {
	for _, n := range notes {
		report.Note(scenario, n)
	}
}
