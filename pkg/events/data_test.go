package events_test

import (
	"os"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestStartupInEvents: the running and terminal events split the current
// attempt's start-up from its creation (waiting for nodes, then the image
// pull and container start), the terminal one also as timings.startup;
// earlier events and an attempt whose workers were not seen carry none.
func TestStartupInEvents(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	b, err := os.ReadFile("../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	r := &runs.Record{RunID: "job-0123456789ab", Name: "job", Source: "gs://intake/jobs/job.json#1", Spec: s, CreatedAt: t0,
		Phase: runs.Running, Attempt: 1, Times: map[runs.Phase]time.Time{runs.Accepted: t0, runs.Running: t0.Add(3 * time.Minute)},
		Attempts: []runs.Attempt{{N: 1, RayJob: "job-0123456789ab-1", CreatedAt: t0.Add(time.Minute),
			Startup: &runs.Startup{ScheduledAt: t0.Add(2*time.Minute + 30*time.Second), StartedAt: t0.Add(3 * time.Minute)}}}}
	want := events.Startup{NodesSeconds: 90, ImageSeconds: 30, Seconds: 120}

	running := events.Data(r, runs.Running, 0)
	if running.Startup == nil || *running.Startup != want {
		t.Errorf("running event's start-up %+v, want %+v", running.Startup, want)
	}
	e, err := events.New("//raydrop.dev/test", running, t0)
	if err != nil {
		t.Fatal(err)
	}
	validateEvent(t, e.Data(), "running")

	r.Phase, r.Outcome, r.Reason, r.Message = runs.Failed, runs.OutcomeFailed, runs.ApplicationError, "training failed: ValueError"
	r.Times[runs.Failed] = t0.Add(10 * time.Minute)
	failed := events.Data(r, runs.Failed, 0)
	if failed.Startup == nil || *failed.Startup != want || failed.Timings["startup"] != 120 {
		t.Errorf("failed event's start-up %+v, timings %v, want %+v and timings.startup 120", failed.Startup, failed.Timings, want)
	}
	e, err = events.New("//raydrop.dev/test", failed, t0)
	if err != nil {
		t.Fatal(err)
	}
	validateEvent(t, e.Data(), "failed")

	if accepted := events.Data(r, runs.Accepted, 0); accepted.Startup != nil {
		t.Errorf("accepted event carries a start-up: %+v", accepted.Startup)
	}
	r.Attempts[0].Startup = nil
	if d := events.Data(r, runs.Failed, 0); d.Startup != nil || d.Timings["startup"] != 0 {
		t.Errorf("an attempt whose workers were never seen has a start-up: %+v %v", d.Startup, d.Timings)
	}
}
