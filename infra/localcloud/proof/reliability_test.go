package proof_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// testCrashes kills each function's process right after each write it
// makes for a run (a Cloud Storage or Kubernetes write that took effect),
// before it sees the answer, and restarts it: the run still ends once. The
// four functions' lanes run side by side, each on its own cluster, each
// trying the 1st, 2nd, ... write until a run passes without reaching it.
func testCrashes(t *testing.T) {
	t.Run("lanes", func(t *testing.T) {
		for _, fn := range stack.Functions {
			t.Run(fn, func(t *testing.T) {
				t.Parallel()
				crashLane(t, fn)
			})
		}
		t.Run("Monitor-stall", func(t *testing.T) {
			t.Parallel()
			stallCrashLane(t)
		})
	})
}

// stallWrites is how many of the monitor's writes after a stall's
// detection the stall lane kills it after: the request for stacks, the
// suspicion's record and its event's, then the action (the RayJob's
// deletion, the restart's record). The evidence's writes in between are
// not counted: the Monitor and Finalize lanes kill after each of those.
const stallWrites = 5

// stallCrashLane kills the monitor right after its k-th write from a
// stall's detection on (the request for the ranks' stacks is the first),
// for k = 1 … stallWrites, and restarts it: the hung attempt is still
// restarted once, from its checkpoint, the run succeeds on its second
// attempt, and the stall is announced once (a copy under the same
// CloudEvent ID only where a kill cut its publisher short).
func stallCrashLane(t *testing.T) {
	scenario := "crash Monitor between a stall's detection and its restart"
	cluster := "crash-stall"
	report.Note(scenario, fmt.Sprintf("the first %d of the monitor's writes for the run from its request for the ranks' stacks on, the evidence's not counted, one kill per run", stallWrites))
	for k := 1; k <= stallWrites; k++ {
		data := spec(t, cluster, map[string]any{"limits": map[string]any{"stallAfter": "10s"}})
		runID := upload(t, fmt.Sprintf("crash-stall-%d", k), data, "outcome=hang,at=3,hangs=1,steps=2,step=200ms")
		var armed atomic.Bool
		mine := func(r faults.Request) bool {
			p, err := url.PathUnescape(r.Path)
			if err != nil {
				p = r.Path
			}
			if strings.Contains(p, runID) && strings.Contains(p, "stacks-request.json") {
				armed.Store(true)
			}
			if !armed.Load() || !strings.Contains(p, runID) && !strings.Contains(p, cluster) {
				return false
			}
			return !strings.Contains(p, "/evidence/attempt-")
		}
		crashed, disarm := st.CrashAt("Monitor", k, mine, 300*time.Millisecond)
		checkRun(t, scenario, runID, cluster, outcome{phase: runs.Succeeded, attempts: 2})
		disarm()
		seen := evs.Of(runID)
		if n, notes := unexplainedCopies(seen, events.Stalled); probe.Count(seen, events.Stalled) == 0 || n > 0 {
			t.Errorf("run %s: %d stalled events", runID, probe.Count(seen, events.Stalled))
			report.Add(scenario, n, 0, fmt.Sprintf("run %s: %d stalled events", runID, probe.Count(seen, events.Stalled)))
		} else {
			noteAll(scenario, notes)
		}
		if rec, err := probe.Runs(st).Get(context.Background(), runID); err == nil && (rec.Attempt != 2 || rec.Attempts[0].Reason != runs.Stalled) {
			t.Errorf("run %s: attempt %d, the first ended %s; want restarted as stalled once", runID, rec.Attempt, rec.Attempts[0].Reason)
		}
		select {
		case c := <-crashed:
			report.Note(scenario, fmt.Sprintf("killed after write %d from the detection: %s", k, c.After))
		default:
			report.Note(scenario, fmt.Sprintf("run %s made fewer than %d writes from the detection: every write point covered", runID, k))
			return
		}
	}
}

func crashLane(t *testing.T, fn string) {
	scenario := "crash " + fn
	cluster := "crash-" + strings.ToLower(fn)
	report.Note(scenario, fmt.Sprintf("recovery bound %s (StaleStep %s + tick %s); each terminal event waited for up to that + %s margin after its run ended",
		recoveryBound, runs.StaleStep, tick, recoveryMargin))
	if fn == "Finalize" {
		report.Note(scenario, "the evidence's container logs, written a few at once in no set order, count as one write point: the first of them")
	}
	for k := 1; k <= 16; k++ {
		runID := fmt.Sprintf("crash-%s-%d", strings.ToLower(fn), k)
		// The run's own writes, and every Kubernetes create: a create is
		// POSTed to the collection, its name is in the body only.
		var logSeen atomic.Bool
		mine := func(r faults.Request) bool {
			if !strings.Contains(r.Path, runID) && !strings.Contains(r.Path, cluster) &&
				(r.Method != "POST" || !strings.HasPrefix(r.Path, "/api")) {
				return false
			}
			return !evidenceLog(r.Path) || !logSeen.Swap(true)
		}
		crashed, disarm := st.CrashAt(fn, k, mine, 300*time.Millisecond)
		request(t, spec(t, cluster, map[string]any{"runId": runID}))
		checkRun(t, scenario, runID, cluster, outcome{phase: runs.Succeeded})
		disarm()
		select {
		case c := <-crashed:
			after := "no terminal event"
			if e := probe.Terminal(evs.Of(runID)); e != nil {
				switch d := e.At.Sub(c.At); {
				case d >= 0:
					after = fmt.Sprintf("terminal event %.1f s after the kill", d.Seconds())
				case strings.Contains(c.After, runID):
					// The run's own write after its terminal event: the
					// report's step (the report, its record, its event).
					after = fmt.Sprintf("terminal event %.1f s before the kill, which cut the report's step short", -d.Seconds())
				default:
					// Creates are matched by collection: the write was
					// another lane's, after this run had ended.
					after = fmt.Sprintf("the run ended %.1f s before the kill (the write was another run's create)", -d.Seconds())
				}
			}
			if e := probe.Report(evs.Of(runID)); e != nil {
				when := "after"
				if e.At.Before(c.At) {
					when = "before"
				}
				after += fmt.Sprintf("; %s event %.1f s %s the kill", events.ReportReady, e.At.Sub(c.At).Abs().Seconds(), when)
			}
			report.Note(scenario, fmt.Sprintf("killed after write %d: %s; %s", k, c.After, after))
		default:
			report.Note(scenario, fmt.Sprintf("run %s made fewer than %d writes: every write point covered", runID, k))
			return
		}
	}
}

// evidenceLog reports whether a request's path writes a container log of
// a run's evidence (evidence/attempt-<n>/logs/..., escaped in the path).
func evidenceLog(path string) bool {
	p, err := url.PathUnescape(path)
	if err != nil {
		p = path
	}
	if i := strings.Index(p, "name="); i >= 0 {
		p = p[i:]
	}
	return strings.Contains(p, "/evidence/attempt-") && strings.Contains(p, "/logs/")
}

// testAPIServer answers half the functions' Kubernetes writes with 409
// Conflict, then cuts the API server off for 30 s in the middle of runs.
func testAPIServer(t *testing.T) {
	t.Run("conflicts", func(t *testing.T) {
		start := time.Now()
		st.KubeProxy.SetConflictShare(0.5)
		defer st.KubeProxy.SetConflictShare(0)
		var wg sync.WaitGroup
		for i := range 4 {
			runID := fmt.Sprintf("conflict-%d", i)
			cluster := fmt.Sprintf("conflict-%d", i)
			request(t, spec(t, cluster, map[string]any{"runId": runID}))
			wg.Go(func() { checkRun(t, "apiserver 409 on 50% of writes", runID, cluster, outcome{phase: runs.Succeeded}) })
		}
		wg.Wait()
		injected := 0
		for _, r := range st.KubeProxy.Requests() {
			if r.Injected && r.At.After(start) {
				injected++
			}
		}
		report.Note("apiserver 409 on 50% of writes", fmt.Sprintf("%d conflicts injected", injected))
		if injected == 0 {
			t.Error("no conflict was injected")
		}
	})
	t.Run("outage", func(t *testing.T) {
		var wg sync.WaitGroup
		var ids []string
		// Training takes about 18 s (3 epochs of 6 steps of 1 s): the API
		// server goes away once both runs train, and comes back 30 s later,
		// after they ended.
		for i := range 2 {
			ids = append(ids, upload(t, fmt.Sprintf("outage-%d", i), spec(t, fmt.Sprintf("outage-%d", i), nil), "steps=6,step=1s"))
		}
		for _, id := range ids {
			if _, err := probe.WaitPhase(context.Background(), st, id, 90*time.Second, runs.Running, runs.Finishing, runs.Succeeded, runs.Failed); err != nil {
				t.Fatal(err)
			}
		}
		st.KubeProxy.Down()
		down := time.Now()
		// A run submitted during the outage waits for the API server too.
		ids = append(ids, upload(t, "outage-2", spec(t, "outage-2", nil), "steps=2,step=200ms"))
		time.Sleep(30 * time.Second)
		if err := st.KubeProxy.Up(); err != nil {
			t.Fatal(err)
		}
		report.Note("apiserver down 30 s mid-run", fmt.Sprintf("API server unreachable for the functions for %.1f s", time.Since(down).Seconds()))
		for i, id := range ids {
			wg.Go(func() {
				checkRun(t, "apiserver down 30 s mid-run", id, fmt.Sprintf("outage-%d", i), outcome{phase: runs.Succeeded})
			})
		}
		wg.Wait()
	})
}

// copies redelivers what Eventarc delivered for tracked runs, as Pub/Sub's
// at-least-once delivery does: the same push (same message ID, same data)
// posted again to the trigger's push endpoint. A run tracked with n gets
// n-1 copies of each of its deliveries (the intake event, the request and
// every stage message) all at once as soon as the original was delivered,
// and n more of each after the run ended (late).
type copies struct {
	mu       sync.Mutex
	times    map[string]int      // run ID → n
	captured map[string]bool     // route|message ID → copied already
	pushes   map[string][]copied // run ID → its deliveries
	sent     map[string]int      // run ID → copies posted
}

type copied struct {
	route string
	body  []byte
}

func newCopies() *copies {
	return &copies{times: map[string]int{}, captured: map[string]bool{}, pushes: map[string][]copied{}, sent: map[string]int{}}
}

func (c *copies) track(runID string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times[runID] = n
}

// seen is the adapter's observer: it copies the first delivery of each
// message of a tracked run.
func (c *copies) seen(d eventarc.Delivery) {
	if d.Outcome != eventarc.Delivered {
		return
	}
	runID, object, body := pushOf(d)
	if runID == "" {
		return
	}
	c.mu.Lock()
	n := c.times[runID]
	if n == 0 && object != "" {
		// An upload tracked by its name: its run is tracked from now on,
		// before its first stage message can arrive.
		if n = c.times[object]; n > 0 {
			c.times[runID] = n
		}
	}
	key := d.Route + "|" + d.Event.ID()
	first := n > 0 && !c.captured[key]
	if first {
		c.captured[key] = true
		c.pushes[runID] = append(c.pushes[runID], copied{d.Route, body})
	}
	c.mu.Unlock()
	if first && n > 1 {
		go c.post(runID, copied{d.Route, body}, n-1)
	}
}

// post posts n copies of a push at once.
func (c *copies) post(runID string, p copied, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := http.Post(st.Adapter.PushEndpoint(p.route), "application/json", bytes.NewReader(p.body))
			if err == nil {
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	c.sent[runID] += n
	c.mu.Unlock()
}

// late posts every delivery of the run n more times, all at once.
func (c *copies) late(runID string, n int) int {
	c.mu.Lock()
	pushes := slices.Clone(c.pushes[runID])
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pushes {
		wg.Go(func() { c.post(runID, p, n) })
	}
	wg.Wait()
	return len(pushes)
}

// pushOf rebuilds the Pub/Sub push a delivery came from and finds its run.
func pushOf(d eventarc.Delivery) (runID, object string, body []byte) {
	ev := d.Event
	switch ev.Type() {
	case eventarc.PubSubPublishedType:
		// The event's data is the push's own body: message and subscription.
		return stepRun(ev), "", ev.Data()
	case eventarc.StorageFinalizedType:
		var o struct {
			Bucket     string `json:"bucket"`
			Name       string `json:"name"`
			Generation string `json:"generation"`
		}
		if json.Unmarshal(ev.Data(), &o) != nil || !strings.HasPrefix(o.Name, "jobs/") {
			return "", "", nil
		}
		gen, _ := strconv.ParseInt(o.Generation, 10, 64)
		body, _ = json.Marshal(map[string]any{
			"message": map[string]any{
				"data": ev.Data(), "messageId": ev.ID(), "publishTime": ev.Time().Format(time.RFC3339Nano),
				"attributes": map[string]string{
					"eventType": "OBJECT_FINALIZE", "bucketId": o.Bucket, "objectId": o.Name,
					"objectGeneration": o.Generation, "payloadFormat": "JSON_API_V1",
				},
			},
			"subscription": "projects/" + stack.Project + "/subscriptions/" + d.Route,
		})
		return names.RunIDFromObject(o.Bucket, o.Name, gen), o.Name, body
	}
	return "", "", nil
}

// testDuplicates delivers the intake event (or the request) and each stage
// message of a run 2, 10 and 100 times, the copies all at once and again
// after the run ended: one RayJob and one terminal event per run, every
// time.
func testDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, n := range []int{2, 10, 100} {
		scenario := fmt.Sprintf("duplicates x%d", n)
		for _, via := range []string{"object", "request"} {
			wg.Go(func() {
				cluster := fmt.Sprintf("dup-%s-%d", via, n)
				var runID string
				if via == "object" {
					// Tracked by object name before the upload: the copies
					// start with the intake event.
					dups.track("jobs/"+cluster+".json", n)
					runID = upload(t, cluster, spec(t, cluster, nil), "steps=2,step=200ms")
				} else {
					runID = cluster
					dups.track(runID, n)
					request(t, spec(t, cluster, map[string]any{"runId": runID}))
				}
				if _, err := probe.WaitPhase(ctx, st, runID, 150*time.Second, probe.Ended...); err != nil {
					t.Error(err)
				}
				deliveries := dups.late(runID, n)
				time.Sleep(6 * time.Second) // three ticks
				dups.mu.Lock()
				sent := dups.sent[runID]
				dups.mu.Unlock()
				report.Note(scenario, fmt.Sprintf("%s (%s): %d deliveries, each copied %d times at once and %d times late: %d copies", runID, via, deliveries, n-1, n, sent))
				checkRun(t, scenario, runID, cluster, outcome{phase: runs.Succeeded})
			})
		}
	}
	wg.Wait()
}

// testLostMessages loses one provisioned, one submitted and one finished
// message (Eventarc acknowledges each and never delivers it): the tick's
// sweep drives each run to its end and the workers to zero.
func testLostMessages(t *testing.T) {
	t.Parallel()
	lose := map[string]string{"provisioned": "submit", "submitted": "monitor-submitted", "finished": "finalize"}
	var wg sync.WaitGroup
	for stage, route := range lose {
		runID := "lost-" + stage
		scenario := "lost " + stage + " message"
		st.Adapter.DropMatching(route, 1, func(ev event.Event) bool { return stepRun(ev) == runID })
		request(t, spec(t, runID, map[string]any{"runId": runID}))
		wg.Go(func() {
			checkRun(t, scenario, runID, runID, outcome{phase: runs.Succeeded, limit: 180 * time.Second})
			if got := st.Adapter.Stats()[route].Dropped; got < 1 {
				t.Errorf("%s: no %s push was dropped", scenario, route)
				report.Add(scenario, 0, 0, "the message was never lost")
			}
		})
	}
	wg.Wait()
}

// stepRun is the run ID of a stage message's messagePublished event.
func stepRun(ev event.Event) string {
	var d struct {
		Message struct {
			Data []byte `json:"data"`
		} `json:"message"`
	}
	var step struct {
		RunID string `json:"runId"`
	}
	if json.Unmarshal(ev.Data(), &d) != nil || json.Unmarshal(d.Message.Data, &step) != nil {
		return ""
	}
	return step.RunID
}
