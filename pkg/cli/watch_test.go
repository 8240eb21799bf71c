package cli

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TestPassedPhases: watch shows the phases a run went through between two
// reads of its record, in order, from the times the record keeps.
func TestPassedPhases(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	r := &runs.Record{Phase: runs.Finishing, Times: map[runs.Phase]time.Time{
		runs.Accepted: t0, runs.Provisioned: t0.Add(time.Second), runs.Submitted: t0.Add(2 * time.Second),
		runs.Running: t0.Add(9 * time.Second), runs.Finishing: t0.Add(9200 * time.Millisecond),
	}}
	for _, tc := range []struct {
		after time.Time
		want  []runs.Phase
	}{
		{time.Time{}, []runs.Phase{runs.Accepted, runs.Provisioned, runs.Submitted, runs.Running}},
		{t0.Add(2 * time.Second), []runs.Phase{runs.Running}},
		{t0.Add(9 * time.Second), nil},
	} {
		if got := passed(r, tc.after); !slices.Equal(got, tc.want) {
			t.Errorf("passed(after %s) = %v, want %v", tc.after.Format(time.TimeOnly), got, tc.want)
		}
	}
}

// TestCapacityShown: status and watch say why an attempt waits for
// capacity, on which tier, and how many attempts preemption took.
func TestCapacityShown(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s := spec.Defaults()
	s.Cluster.Reservation = "b200"
	s.Cluster.Capacity = []spec.Tier{{Type: spec.TierReservation, Wait: spec.Duration(10 * time.Minute)}, {Type: spec.TierSpot}}
	moved := t0.Add(10 * time.Minute)
	r := &runs.Record{Phase: runs.Submitted, Spec: &s, Attempt: 2, Attempts: []runs.Attempt{
		{N: 1, CreatedAt: t0, Outcome: runs.OutcomeRetried, Reason: runs.Preempted},
		{N: 2, CreatedAt: t0, Tier: 1, TierSince: &moved, Waiting: "waiting for capacity on tier 2 (spot): 0 of 2 workers running"},
	}}
	if got := progressText(r, moved); got != r.Attempts[1].Waiting {
		t.Errorf("progress %q, want the wait", got)
	}
	want := "tier 2 of 2 (spot) since " + moved.Local().Format(time.TimeOnly) + " · 1 attempt lost to preemption"
	if got := capacityText(r); got != want {
		t.Errorf("capacity %q, want %q", got, want)
	}
	ran := moved.Add(time.Minute)
	r.Attempts[1].RunningAt = &ran
	if got := progressText(r, ran); got != "" {
		t.Errorf("a running attempt without progress shows %q", got)
	}
	d := spec.Defaults()
	if got := capacityText(&runs.Record{Spec: &d, Attempt: 1, Attempts: []runs.Attempt{{N: 1}}}); got != "" {
		t.Errorf("the default single tier shows %q", got)
	}
	// How the workers came up, once the monitor saw them all run.
	if got := startupText(r); got != "" {
		t.Errorf("an attempt with no start-up recorded shows %q", got)
	}
	r.Attempts[1].Startup = &runs.Startup{ScheduledAt: moved.Add(-5 * time.Second), StartedAt: moved.Add(21 * time.Second)}
	if got, want := startupText(r), "10m21s: nodes 9m55s, image 26s"; got != want {
		t.Errorf("start-up %q, want %q", got, want)
	}
}

// TestModelText: status names the commit the run trains from, where the
// workers read it, and who staged it.
func TestModelText(t *testing.T) {
	const c = "0123456789abcdef0123456789abcdef01234567"
	m := &runs.Model{Repo: "google/gemma-3-4b-it", Revision: "main", Commit: c, URI: "gs://b/models/google/gemma-3-4b-it/" + c, StagedBy: "run-a"}
	for _, tt := range []struct {
		run    string
		staged bool
		want   string
	}{
		{"run-a", false, "staged by this run from the Hub"},
		{"run-b", false, "being staged by run-a"},
		{"run-b", true, "staged already by run-a"},
	} {
		mm := *m
		mm.Staged = tt.staged
		got := modelText(&runs.Record{RunID: tt.run, Model: &mm})
		if want := "google/gemma-3-4b-it@" + c + " (revision main), read from " + m.URI + ", " + tt.want; got != want {
			t.Errorf("%s (staged %v): %q, want %q", tt.run, tt.staged, got, want)
		}
	}
	if got := modelText(&runs.Record{}); got != "" {
		t.Errorf("a run without staging shows %q", got)
	}
}

// TestShowReport: once the run has ended, watch waits for its report's
// announcement and prints it; says why there is none; or says it is not
// ready when the wait runs out.
func TestShowReport(t *testing.T) {
	s := spec.Defaults()
	ended := func(edit func(*runs.Record)) *runs.Record {
		r := &runs.Record{RunID: "r1", Phase: runs.Succeeded, Spec: &s, Published: []runs.Phase{runs.Succeeded}}
		if edit != nil {
			edit(r)
		}
		return r
	}
	const uri = "gs://out/raydrop/r1/report.html"
	reported := ended(func(r *runs.Record) { r.Report = uri; r.MarkPublished(runs.ReportReady) })
	for _, c := range []struct {
		name        string
		reads       []*runs.Record // what each later read of the record returns
		limit       time.Duration
		out, stderr string
	}{
		{"announced two reads later", []*runs.Record{ended(nil), ended(func(r *runs.Record) { r.Report = uri }), reported}, time.Minute, "report     " + uri + "\n", ""},
		{"no report for good", []*runs.Record{ended(func(r *runs.Record) { r.NoReport = "403 Forbidden" })}, time.Minute, "", "run r1 has no report: 403 Forbidden\n"},
		{"not ready within the wait", nil, 0, "", "the report of run r1 is not ready after 0s: raydrop report r1 prints it once it is\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut strings.Builder
			reads := 0
			get := func() (*runs.Record, error) {
				reads++
				if reads > len(c.reads) {
					return nil, errors.New("read more often than the test allows")
				}
				return c.reads[reads-1], nil
			}
			showReport(context.Background(), &env{stdout: &out, stderr: &errOut}, ended(nil), time.Millisecond, c.limit, get)
			if out.String() != c.out || errOut.String() != c.stderr {
				t.Errorf("printed %q and %q, want %q and %q", out.String(), errOut.String(), c.out, c.stderr)
			}
			if reads != len(c.reads) {
				t.Errorf("%d reads, want %d", reads, len(c.reads))
			}
		})
	}
}
