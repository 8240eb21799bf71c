package flow_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

var (
	interleavings = flag.Int("interleavings", 60, "random interleavings TestRandomInterleavings plays (make fuzz plays 10,000)")
	firstSeed     = flag.Uint64("seed", 1, "seed of TestRandomInterleavings' first interleaving")
)

// TestRandomInterleavings plays random interleavings of what the platform
// and the users do to the pipeline, against the real handlers: duplicate,
// late, reordered and lost deliveries, instances that crash between two
// writes (before or after a write, then every later call of that delivery
// fails, as in a dead process), cancellations, ticks, and RayJobs that run,
// succeed, fail or are lost. After every step it checks that a terminal
// phase never changes, that a run has at most one terminal event (a copy
// under the same CloudEvent ID only where the delivery that published it
// died before recording it), that no event follows a terminal one, and that
// an announced run holds no lease. Then the faults stop, the platform keeps
// delivering and ticking, and every run must end, announced once, with the
// lease free and the cluster's workers at zero.
//
// Each interleaving is one seed; a failure names it, and
//
//	go test ./functions/flow -run TestRandomInterleavings -seed N -interleavings 1 -v
//
// replays it with its steps.
func TestRandomInterleavings(t *testing.T) {
	t.Cleanup(func() {
		// The interleavings must have played sweeps to their end, a trial
		// stopped early among them, or the sweep invariants held vacuously.
		ended, stopped := sweepsEnded.Load(), trialsStopped.Load()
		t.Logf("%d interleavings: %d sweeps ended, %d trials stopped early", *interleavings, ended, stopped)
		if *interleavings >= 60 && (ended == 0 || stopped == 0) {
			t.Errorf("%d interleavings ended %d sweeps and stopped %d trials early: the sweep paths went unplayed", *interleavings, ended, stopped)
		}
	})
	for i := range *interleavings {
		seed := *firstSeed + uint64(i)
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			c := newChaos(t, seed)
			c.play(40)
			c.settle()
		})
	}
}

// sweepsEnded and trialsStopped count, over every interleaving, the
// sweeps that ended announced and the trials the median rule stopped.
var sweepsEnded, trialsStopped atomic.Int64

// errCrash is an injected crash.
var errCrash = errors.New("injected crash: the instance died")

// chaos drives one interleaving.
type chaos struct {
	*world
	// fmu guards the fault state below: a sweep checks runs side by side,
	// so its calls reach fault at once. (Which of them crashes first can
	// then differ between two plays of one seed.)
	fmu       sync.Mutex
	rng       *rand.Rand
	inflight  []msg             // delivered at least once more, in any order
	crashed   bool              // the delivery in progress has crashed
	faults    bool              // inject crashes
	published []string          // CloudEvent IDs the delivery in progress published
	mayRepeat map[string]bool   // IDs whose publisher died before recording them
	ended     map[string]string // run → the terminal phase it reached
	specs     []string          // run IDs, in upload order
	sweeps    []string          // sweep IDs, in upload order
	midway    map[string]bool   // trials that reported a checkpoint while settling
	steps     []string
}

func newChaos(t *testing.T, seed uint64) *chaos {
	w := newWorld(t)
	w.faulty = true
	c := &chaos{world: w, rng: rand.New(rand.NewPCG(seed, seed)), faults: true, mayRepeat: map[string]bool{}, ended: map[string]string{}, midway: map[string]bool{}}
	d := w.deps
	d.Runs = faultyRuns{d.Runs, c}
	d.Leases = faultyLeases{d.Leases, c}
	d.Sweeps = faultySweeps{d.Sweeps, c}
	d.Publisher = faultyPublisher{c}
	return c
}

// fault decides whether the call the delivery in progress makes now
// crashes, and whether before or after its write.
func (c *chaos) fault() (before, after bool) {
	c.mu.Lock()
	delivering := c.current != nil
	c.mu.Unlock()
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if c.crashed {
		return true, false
	}
	if !c.faults || !delivering || c.rng.Float64() > 0.04 {
		return false, false
	}
	c.crashed = true
	if c.rng.IntN(2) == 0 {
		return true, false
	}
	return false, true
}

func (c *chaos) wrap(op func() error) error {
	before, after := c.fault()
	if before {
		return errCrash
	}
	err := op()
	if after {
		return errCrash
	}
	return err
}

func (c *chaos) step(format string, args ...any) {
	c.steps = append(c.steps, fmt.Sprintf("%3d %s", len(c.steps), fmt.Sprintf(format, args...)))
}

func (c *chaos) fail(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("%s\nsteps:\n%s", fmt.Sprintf(format, args...), strings.Join(c.steps, "\n"))
}

// play makes n random moves, checking the invariants after each.
func (c *chaos) play(n int) {
	for range n {
		c.collect()
		switch r := c.rng.IntN(100); {
		case len(c.specs) == 0 || r < 10 && len(c.specs) < 3:
			c.upload()
		case r < 55 && len(c.inflight) > 0:
			c.deliverOne(c.rng.IntN(10) == 0)
		case r < 60 && len(c.inflight) > 0:
			i := c.rng.IntN(len(c.inflight))
			c.step("lose %s %s", c.inflight[i].topic, c.inflight[i].data)
			c.inflight = slices.Delete(c.inflight, i, i+1)
		case r < 75:
			c.now = c.now.Add(time.Duration(c.rng.IntN(30)) * time.Second)
			c.tick()
		case r < 80:
			// A user cancels a run or a sweep they saw: one that has a
			// record (a cancellation naming neither is refused as bad
			// input).
			ids := append(c.runIDs(), c.sweeps...)
			id := ids[c.rng.IntN(len(ids))]
			_, rerr := c.deps.Runs.Get(c.ctx, id)
			_, serr := c.rawSweeps().Get(c.ctx, id)
			if rerr == nil || serr == nil {
				c.step("cancel %s", id)
				c.enqueue(c.deps.Config.Topics.Requests, nil, map[string]string{"action": "cancel", "runId": id})
			}
		default:
			ids := c.runIDs()
			c.kuberay(ids[c.rng.IntN(len(ids))])
		}
		c.collect()
		c.check()
	}
}

// settle stops the faults and lets the platform go on until every run has
// ended, then checks the end state.
func (c *chaos) settle() {
	c.faults = false
	c.step("faults stop")
	// The runs share one cluster, so they end one after another, a few
	// rounds each (admitted, submitted, a trial's checkpoint midway,
	// ended): the bound grows with the runs and trials there are.
	work := len(c.specs)
	for _, id := range c.sweeps {
		if sw, err := c.rawSweeps().Get(c.ctx, id); err == nil {
			work += len(sw.Trials)
		}
	}
	for round := 0; round < max(30, 3*work); round++ {
		// Every message in flight is delivered; one that fails comes back
		// in the next round, after the clock moved (Pub/Sub's back-off),
		// so a claim its crashed delivery left can expire.
		for range 200 {
			if c.collect(); len(c.inflight) == 0 {
				break
			}
			c.deliverOne(false)
		}
		open := 0
		for _, id := range c.sweeps {
			if sw, err := c.rawSweeps().Get(c.ctx, id); err == nil && (!sw.Phase.Terminal() || !sw.Published) {
				open++
			}
		}
		for _, id := range c.runIDs() {
			r, err := c.deps.Runs.Get(c.ctx, id)
			if errors.Is(err, runs.ErrNotFound) {
				continue // its intake was lost before it made a record
			}
			if err != nil {
				c.fail("read %s: %v", id, err)
			}
			if !r.Phase.Terminal() || r.Unannounced() {
				open++
				switch {
				case r.Phase.HasJob() && r.Trial != nil && !c.midway[id]:
					// A trial reports a checkpoint before it ends, for
					// the median rule to judge.
					c.midway[id] = true
					c.kuberayCheckpoint(id, r.Attempt)
				case r.Phase.HasJob():
					c.succeedJob(id, r.Attempt)
				case r.Phase == runs.Checking:
					c.passCheck(id)
				}
			}
		}
		// A lease taken by a run whose intake was lost before it wrote
		// a record is held until HolderWithoutRecord has passed; then the
		// sweep takes it back.
		l := c.rawLease()
		orphanMayWait := l.Holder != "" && c.now.Sub(l.Updated) <= pipeline.HolderWithoutRecord
		if open == 0 && round > 0 && !orphanMayWait {
			c.check()
			c.checkEnd()
			return
		}
		c.now = c.now.Add(c.deps.Config.ScaleDownAge + time.Second)
		c.tick()
		c.check()
	}
	c.fail("runs did not end after the faults stopped")
}

// collect moves what the handlers published into the in-flight set.
func (c *chaos) collect() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight = append(c.inflight, c.queue...)
	c.queue = nil
}

func (c *chaos) enqueue(topic string, data []byte, attrs map[string]string) {
	c.mu.Lock()
	c.queue = append(c.queue, msg{topic, data, attrs})
	c.mu.Unlock()
}

func (c *chaos) upload() {
	name := fmt.Sprintf("jobs/run-%d.json", len(c.specs)+len(c.sweeps))
	body := example(c.t)
	sweep := false
	switch c.rng.IntN(4) {
	case 0:
		body = checkedExample(c.t) // the data check first
	case 1:
		// A sweep of three trials on the one cluster, stopping trials
		// early half of the time.
		sweep = true
		body = sweepSpec(c.t, []float64{1e-4, 2e-4, 4e-4}, func(sw map[string]any) {
			sw["clusters"] = []any{"gemma3-tuning"}
			if c.rng.IntN(2) == 0 {
				delete(sw, "earlyStopping")
			}
		})
	}
	e := c.world.upload(name, body)
	id := names.RunIDFromObject(intake, name, mustGen(c.t, e))
	if sweep {
		c.sweeps = append(c.sweeps, id)
		c.step("upload %s (sweep %s)", name, id)
	} else {
		c.specs = append(c.specs, id)
		c.step("upload %s (run %s)", name, id)
	}
	c.inflight = append(c.inflight, msg{topic: "intake", data: e.Data(), attrs: map[string]string{"event-id": e.ID(), "subject": e.Subject()}})
}

// deliverOne delivers a random in-flight message (keeping a copy to deliver
// again when dup); a failed delivery goes back, as Pub/Sub redelivers it.
func (c *chaos) deliverOne(dup bool) {
	i := c.rng.IntN(len(c.inflight))
	m := c.inflight[i]
	if !dup {
		c.inflight = slices.Delete(c.inflight, i, i+1)
	}
	var e event.Event
	if m.topic == "intake" {
		e = event.New()
		e.SetID(m.attrs["event-id"])
		e.SetType(pipeline.StorageFinalized)
		e.SetSource("//storage.googleapis.com/projects/_/buckets/" + intake)
		e.SetSubject(m.attrs["subject"])
		_ = e.SetData("application/json", m.data)
	} else {
		e = c.pubsubEvent(m.topic, m.data, m.attrs)
	}
	crashed, err := c.deliverCrashing(m.topic, e)
	c.step("deliver %s %s: crashed %v, error %v", m.topic, m.data, crashed, err)
	switch {
	case pipeline.IsPermanent(err):
		c.fail("delivery of %s %s: %v", m.topic, m.data, err)
	case err != nil:
		c.inflight = append(c.inflight, m) // redelivered later
	}
}

// deliverCrashing delivers e, reporting whether the delivery crashed; the
// public events a crashed delivery published may be published again.
func (c *chaos) deliverCrashing(topic string, e event.Event) (crashed bool, err error) {
	c.crashed, c.published = false, nil
	err = c.deliver(topic, e)
	crashed, c.crashed = c.crashed, false
	if crashed {
		for _, id := range c.published {
			c.mayRepeat[id] = true
		}
	}
	return crashed, err
}

func (c *chaos) tick() {
	c.step("tick at +%s", c.now.Sub(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)))
	crashed, err := c.deliverCrashing(c.deps.Config.Topics.Ticks, c.pubsubEvent(c.deps.Config.Topics.Ticks, []byte("tick"), nil))
	if err != nil && !crashed {
		c.fail("tick: %v", err)
	}
}

// kuberay moves the run's current RayJob on, as KubeRay and the trainer
// would: it starts running, succeeds (with checkpoints and the completion
// mark, and the mark's notification), fails in the training code, or is
// lost with its head.
func (c *chaos) kuberay(runID string) {
	r, err := c.deps.Runs.Get(c.ctx, runID)
	if err == nil && r.Phase == runs.Checking {
		c.dataCheck(runID)
		return
	}
	if err != nil || r.Attempt == 0 {
		return
	}
	jobs := c.ray.RayV1().RayJobs("default")
	j, err := jobs.Get(c.ctx, names.RayJob(runID, r.Attempt), metav1.GetOptions{})
	if err != nil {
		return // not created yet, or deleted
	}
	switch c.rng.IntN(5) {
	case 0:
		c.step("kuberay: %s running", j.Name)
		c.setStatus(j, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	case 4:
		c.kuberayCheckpoint(runID, r.Attempt)
	case 1:
		c.step("kuberay: %s succeeded", j.Name)
		c.succeedJob(runID, r.Attempt)
	case 2:
		c.step("kuberay: %s training failed", j.Name)
		c.writeLayout(runID, r.Attempt, 1, "failed")
		c.setStatus(j, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	case 3:
		c.step("kuberay: %s lost its head", j.Name)
		c.writeLayout(runID, r.Attempt, 1, "")
		c.setStatus(j, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	}
}

// dataCheck moves a checking run's check on, as KubeRay and datacheck.py
// would: it runs, passes, refuses the data, or fails without a verdict.
func (c *chaos) dataCheck(runID string) {
	j, err := c.ray.RayV1().RayJobs("default").Get(c.ctx, names.RayJob(runID, 0), metav1.GetOptions{})
	if err != nil {
		return // not created yet
	}
	switch c.rng.IntN(4) {
	case 0:
		c.step("kuberay: data check %s running", j.Name)
		c.setStatus(j, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
	case 1:
		c.step("kuberay: data check %s passed", j.Name)
		c.passCheck(runID)
	case 2:
		c.step("kuberay: data check %s refused the data", j.Name)
		c.put(output, "raydrop/"+runID+"/"+checkpoints.DataCheckFile, `{"ok": false, "reason": "InvalidData", "message": "metadata.jsonl line 3 column 'image': image does not decode"}`)
		c.setStatus(j, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	case 3:
		c.step("kuberay: data check %s failed without a verdict", j.Name)
		c.setStatus(j, rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed)
	}
}

// kuberayCheckpoint has the run's job report a checkpoint with its
// held-out loss and go on: a trial the median rule may stop (its stop
// racing its own end).
func (c *chaos) kuberayCheckpoint(runID string, attempt int) {
	j, err := c.ray.RayV1().RayJobs("default").Get(c.ctx, names.RayJob(runID, attempt), metav1.GetOptions{})
	if err != nil {
		return
	}
	loss := 1 + c.rng.Float64()
	c.step("kuberay: %s checkpoint, held-out loss %.3f", j.Name, loss)
	c.writeLosses(runID, attempt, []float64{loss}, "")
	c.setStatus(j, rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning)
}

func (c *chaos) passCheck(runID string) {
	c.put(output, "raydrop/"+runID+"/"+checkpoints.DataCheckFile, `{"ok": true, "rows": {"total": 10, "kept": 10, "train": 9, "eval": 1, "leftOut": 0}}`)
	if j, err := c.ray.RayV1().RayJobs("default").Get(c.ctx, names.RayJob(runID, 0), metav1.GetOptions{}); err == nil {
		c.setStatus(j, rayv1.JobDeploymentStatusComplete, rayv1.JobStatusSucceeded)
	}
}

func (c *chaos) succeedJob(runID string, attempt int) {
	j, err := c.ray.RayV1().RayJobs("default").Get(c.ctx, names.RayJob(runID, attempt), metav1.GetOptions{})
	if err != nil {
		return
	}
	// Two checkpoints with their held-out losses: a sweep ranks the
	// trials, and stops later ones, by them.
	c.writeLosses(runID, attempt, []float64{1 + c.rng.Float64(), 0.5 + c.rng.Float64()}, "succeeded")
	c.setStatus(j, rayv1.JobDeploymentStatusComplete, rayv1.JobStatusSucceeded)
	// The checkpoint bucket's notification of the mark's notice, as Cloud
	// Storage publishes it (JSON_API_V1 payload, the documented attributes).
	notice := names.MarkNotice(runID, attempt)
	topic := c.deps.Config.Topics.Marks
	e := c.pubsubEvent(topic, fmt.Appendf(nil, `{"bucket":%q,"name":%q,"generation":"1"}`, output, notice),
		map[string]string{"eventType": "OBJECT_FINALIZE", "bucketId": output, "objectId": notice, "payloadFormat": "JSON_API_V1"})
	if crashed, err := c.deliverCrashing(topic, e); err != nil && !crashed {
		c.fail("mark notification: %v", err)
	}
}

func (c *chaos) setStatus(j *rayv1.RayJob, dep rayv1.JobDeploymentStatus, js rayv1.JobStatus) {
	j.Status.JobDeploymentStatus, j.Status.JobStatus = dep, js
	if _, err := c.ray.RayV1().RayJobs("default").UpdateStatus(c.ctx, j, metav1.UpdateOptions{}); err != nil {
		c.fail("update rayjob status: %v", err)
	}
}

// check verifies the invariants that hold after every step.
func (c *chaos) check() {
	c.t.Helper()
	lease := c.rawLease()
	c.checkSweeps()
	for _, id := range c.runIDs() {
		r, err := c.deps.Runs.Get(c.ctx, id)
		if errors.Is(err, runs.ErrNotFound) {
			continue
		}
		if err != nil {
			c.fail("read %s: %v", id, err)
		}
		if was, ok := c.ended[id]; ok && string(r.Phase) != was {
			c.fail("run %s ended %s, then became %s", id, was, r.Phase)
		}
		if r.Phase.Terminal() {
			c.ended[id] = string(r.Phase)
		}
		if r.Phase.Terminal() && !r.Unannounced() && (lease.Holder == id || slices.Contains(lease.Queue, id)) {
			c.fail("run %s ended and was announced but still has the lease %+v", id, lease)
		}
	}
	// Nothing follows the terminal event but a copy of it (its publisher
	// died before recording it) and the report's event, which never comes
	// before it, and comes once (or again under the same ID).
	for _, id := range c.runIDs() {
		var terminal, report []string
		for i, e := range c.eventsOf(id) {
			isReport := e.Type() == events.Type(events.ReportReady)
			switch {
			case isReport && len(terminal) == 0:
				c.fail("run %s: event %d (%s) before its terminal event", id, i, e.ID())
			case isReport && len(report) > 0 && !c.mayRepeat[e.ID()]:
				c.fail("run %s: event %d (%s) a second time", id, i, e.ID())
			case isReport:
				report = append(report, e.ID())
			case len(terminal) > 0 && (e.ID() != terminal[0] || !c.mayRepeat[e.ID()]):
				c.fail("run %s: event %d (%s) after its terminal event %s", id, i, e.ID(), terminal[0])
			}
			if ph, ok := runs.PhaseOfEvent(strings.TrimPrefix(e.Type(), "dev.raydrop.run.v1.")); ok && ph.Terminal() {
				terminal = append(terminal, e.ID())
			}
		}
	}
}

// checkEnd verifies the end state: every run ended and announced once, the
// lease free and the cluster's workers at zero.
func (c *chaos) checkEnd() {
	c.t.Helper()
	for _, id := range c.sweeps {
		sw, err := c.rawSweeps().Get(c.ctx, id)
		if errors.Is(err, sweeps.ErrNotFound) {
			continue // its intake was lost before it made a record
		}
		if err != nil || !sw.Phase.Terminal() || !sw.Published || len(c.eventsOf(id)) == 0 {
			c.fail("sweep %s: %+v %v, want ended and announced", id, sw, err)
		}
		sweepsEnded.Add(1)
		for _, t := range sw.Trials {
			if t.Ended == runs.Stopped {
				trialsStopped.Add(1)
			}
			if t.Started() && t.Ended == "" {
				c.fail("sweep %s ended with trial %d not noted ended", id, t.Index)
			}
			if !t.Started() && !sw.CancelRequested {
				c.fail("sweep %s ended without starting trial %d", id, t.Index)
			}
		}
	}
	for _, id := range c.runIDs() {
		r, err := c.deps.Runs.Get(c.ctx, id)
		if errors.Is(err, runs.ErrNotFound) {
			continue
		}
		if err != nil || !r.Phase.Terminal() || r.Unannounced() {
			c.fail("run %s: %v %v, want ended and announced", id, r, err)
		}
		var types []string
		for _, e := range c.eventsOf(id) {
			if !slices.Contains(types, e.Type()) {
				types = append(types, e.Type())
			}
		}
		// The terminal event last, or before the report's, which every run
		// with a spec gets.
		last := types
		if r.Spec != nil {
			if types[len(types)-1] != events.Type(events.ReportReady) || r.Report == "" {
				c.fail("run %s ended %s with report %q, and its last event is %v, not its report's", id, r.Phase, r.Report, types)
			}
			last = types[:len(types)-1]
		}
		if last[len(last)-1] != events.Type(r.Phase.Event()) {
			c.fail("run %s ended %s but its last event before the report's is %v", id, r.Phase, types)
		}
		if r.Phase != runs.Rejected && types[0] != "dev.raydrop.run.v1.accepted" {
			c.fail("run %s: first event %s, want accepted", id, types[0])
		}
	}
	if l := c.rawLease(); l.Holder != "" || len(l.Queue) != 0 {
		c.fail("every run ended, yet the lease is %+v", l)
	}
	if _, err := c.ray.RayV1().RayClusters("default").Get(c.ctx, "gemma3-tuning", metav1.GetOptions{}); err == nil && c.workers() != 0 {
		c.fail("every run ended, yet the cluster has %d workers", c.workers())
	}
}

// runIDs is every run: those uploaded and the trials the sweeps started.
func (c *chaos) runIDs() []string {
	ids := slices.Clone(c.specs)
	for _, id := range c.sweeps {
		sw, err := c.rawSweeps().Get(c.ctx, id)
		if err != nil {
			continue
		}
		for _, t := range sw.Trials {
			if t.Started() {
				ids = append(ids, t.RunID)
			}
		}
	}
	if len(ids) == 0 {
		return c.sweeps // nothing started yet: a pick finds no record
	}
	return ids
}

// checkSweeps verifies what holds of sweeps after every step: a sweep
// ends once (one terminal event, a copy under the same ID only where its
// publisher died before recording it), and only once every trial it
// started has ended; an ended sweep never changes its phase.
func (c *chaos) checkSweeps() {
	c.t.Helper()
	for _, id := range c.sweeps {
		sw, err := c.rawSweeps().Get(c.ctx, id)
		if errors.Is(err, sweeps.ErrNotFound) {
			continue
		}
		if err != nil {
			c.fail("read sweep %s: %v", id, err)
		}
		if was, ok := c.ended[id]; ok && string(sw.Phase) != was {
			c.fail("sweep %s ended %s, then became %s", id, was, sw.Phase)
		}
		if sw.Phase.Terminal() {
			c.ended[id] = string(sw.Phase)
		}
		evs := c.eventsOf(id)
		for i, e := range evs {
			if i > 0 && (e.ID() != evs[0].ID() || !c.mayRepeat[e.ID()]) {
				c.fail("sweep %s: a second event %s after %s", id, e.ID(), evs[0].ID())
			}
		}
		if len(evs) == 0 {
			continue
		}
		for _, t := range sw.Trials {
			if !t.Started() {
				continue
			}
			r, err := c.deps.Runs.Get(c.ctx, t.RunID)
			if err != nil || !r.Phase.Terminal() {
				c.fail("sweep %s announced its end while trial %d is %v (%v)", id, t.Index, r, err)
			}
		}
	}
}

// rawSweeps reads sweep records without injected faults.
func (c *chaos) rawSweeps() pipeline.SweepStore { return c.deps.Sweeps.(faultySweeps).SweepStore }

// eventsOf is a run's public events, in the order they went out (their
// CloudEvent IDs are <run ID>/<phase>).
func (w *world) eventsOf(runID string) []event.Event {
	var out []event.Event
	for _, e := range w.events {
		if strings.HasPrefix(e.ID(), runID+"/") {
			out = append(out, e)
		}
	}
	return out
}

// rawLease reads the lease without injected faults.
func (c *chaos) rawLease() *pipeline.Lease {
	l, err := withWaiting(c.ctx, c.deps.Leases.(faultyLeases).LeaseStore, "default", "gemma3-tuning")
	if err != nil {
		c.fail("read lease: %v", err)
	}
	return l
}

// faultyRuns injects crashes into the run store.
type faultyRuns struct {
	pipeline.Runs
	c *chaos
}

func (f faultyRuns) Create(ctx context.Context, r *runs.Record) error {
	return f.c.wrap(func() error { return f.Runs.Create(ctx, r) })
}

func (f faultyRuns) Get(ctx context.Context, runID string) (r *runs.Record, err error) {
	err = f.c.wrap(func() error { r, err = f.Runs.Get(ctx, runID); return err })
	return r, err
}

func (f faultyRuns) Update(ctx context.Context, runID string, fn func(*runs.Record) error) (r *runs.Record, err error) {
	err = f.c.wrap(func() error { r, err = f.Runs.Update(ctx, runID, fn); return err })
	return r, err
}

func (f faultyRuns) List(ctx context.Context) (s []runs.Summary, err error) {
	err = f.c.wrap(func() error { s, err = f.Runs.List(ctx); return err })
	return s, err
}

// faultyLeases injects crashes into the lease store.
type faultyLeases struct {
	pipeline.LeaseStore
	c *chaos
}

func (f faultyLeases) Acquire(ctx context.Context, ns, cluster, runID string) (l *pipeline.Lease, err error) {
	err = f.c.wrap(func() error { l, err = f.LeaseStore.Acquire(ctx, ns, cluster, runID); return err })
	return l, err
}

func (f faultyLeases) Release(ctx context.Context, ns, cluster, runID string) (l *pipeline.Lease, next string, err error) {
	err = f.c.wrap(func() error { l, next, err = f.LeaseStore.Release(ctx, ns, cluster, runID); return err })
	return l, next, err
}

func (f faultyLeases) Get(ctx context.Context, ns, cluster string) (l *pipeline.Lease, err error) {
	err = f.c.wrap(func() error { l, err = f.LeaseStore.Get(ctx, ns, cluster); return err })
	return l, err
}

// faultyPublisher injects crashes into Pub/Sub publishing and notes the
// public events a delivery published.
type faultyPublisher struct{ c *chaos }

func (f faultyPublisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) error {
	return f.c.wrap(func() error {
		if topic == f.c.deps.Config.Topics.Events {
			f.c.fmu.Lock()
			f.c.published = append(f.c.published, attrs["ce-id"])
			f.c.fmu.Unlock()
		}
		return f.c.Publish(ctx, topic, data, attrs)
	})
}

// faultySweeps injects crashes into the sweep store.
type faultySweeps struct {
	pipeline.SweepStore
	c *chaos
}

func (f faultySweeps) Create(ctx context.Context, r *sweeps.Record) error {
	return f.c.wrap(func() error { return f.SweepStore.Create(ctx, r) })
}

func (f faultySweeps) Get(ctx context.Context, id string) (r *sweeps.Record, err error) {
	err = f.c.wrap(func() error { r, err = f.SweepStore.Get(ctx, id); return err })
	return r, err
}

func (f faultySweeps) Update(ctx context.Context, id string, fn func(*sweeps.Record) error) (r *sweeps.Record, err error) {
	err = f.c.wrap(func() error { r, err = f.SweepStore.Update(ctx, id, fn); return err })
	return r, err
}

func (f faultySweeps) List(ctx context.Context) (s []sweeps.Summary, err error) {
	err = f.c.wrap(func() error { s, err = f.SweepStore.List(ctx); return err })
	return s, err
}
