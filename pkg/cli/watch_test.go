package cli

import (
	"slices"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
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
