package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
)

// onBus waits, up to limit, until the message bus has every event of the
// run the topic delivered, then checks that it got each as many times as
// the topic did (once, but for a publisher that died before recording it:
// then both have the copy, under the same ID), with the topic's type, id,
// source, subject, time and data, and nothing else of the run.
func onBus(t *testing.T, runID string, topic []probe.Seen, limit time.Duration) {
	t.Helper()
	want, times := map[string]probe.Seen{}, map[string]int{}
	for _, s := range topic {
		want[s.ID] = s
		times[s.ID]++
	}
	var mine map[string]int
	deadline := time.Now().Add(limit)
	for {
		mine = map[string]int{}
		for _, e := range st.Bus.Received() {
			if e.Subject() != events.SubjectPrefix+runID {
				continue
			}
			mine[e.ID()]++
			s, ok := want[e.ID()]
			if !ok {
				t.Errorf("bus: event %s of run %s never came through the topic", e.ID(), runID)
				continue
			}
			if e.Type() != events.Type(s.Phase) || e.Source() == "" || !jsonEqual(e.Data(), s.Raw) {
				t.Errorf("bus: event %s differs from the topic's: type %s, data %s; topic: %s", e.ID(), e.Type(), e.Data(), s.Raw)
			}
		}
		done := true
		for id, n := range times {
			done = done && mine[id] >= n
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	for id, n := range times {
		if mine[id] != n {
			t.Errorf("bus: event %s received %d times, the topic %d", id, mine[id], n)
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return bytes.Equal(ja, jb)
}

// owedOf lists the events the bus owes the run, in the state bucket.
func owedOf(t *testing.T, runID string) []string {
	t.Helper()
	var out []string
	for _, a := range objects(t, st.GCS.Bucket(stack.StateBucket), "owed/"+runID+"/") {
		out = append(out, a.Name)
	}
	return out
}

// TestBusOutage: while the message bus is down, a run goes on and ends
// as usual, its events reach the topic, and the bus's share is written down
// as owed; once the bus is back, the sweep publishes every one of them to
// it, once.
func TestBusOutage(t *testing.T) {
	t.Parallel()
	st.Bus.SetDown(true)
	up := false
	defer func() {
		if !up {
			st.Bus.SetDown(false)
		}
	}()
	refusedBefore := st.Bus.Refused()
	runID := upload(t, "busdown", specFor(t, "e2e-busdown", nil), "steps=2,step=200ms")
	r := waitPhase(t, runID, 90*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded {
		t.Fatalf("run ended %s (%s) while the bus was down", r.Phase, r.Message)
	}
	// Every event of the run: the terminal one, then the report's.
	if _, err := evs.WaitTerminal(runID, 40*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := evs.WaitReport(runID, 40*time.Second, time.Second); err != nil {
		t.Fatal(err)
	}
	seen, err := evs.WaitPublished(context.Background(), st, runID, 40*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	owed := owedOf(t, runID)
	for _, e := range st.Bus.Received() {
		if e.Subject() == events.SubjectPrefix+runID {
			t.Errorf("the bus took %s while down", e.ID())
		}
	}
	if len(owed) != len(seen) || st.Bus.Refused() <= refusedBefore {
		t.Errorf("%d events owed to the bus (%v), %d published on the topic; refused %d", len(owed), owed, len(seen), st.Bus.Refused()-refusedBefore)
	}
	st.Bus.SetDown(false)
	up = true
	onBus(t, runID, seen, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for len(owedOf(t, runID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
	}
	if left := owedOf(t, runID); len(left) > 0 {
		t.Errorf("still owed after the bus came back: %v", left)
	}
}
