package cli

import (
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

func TestCheckText(t *testing.T) {
	now := time.Now()
	passed := &checkpoints.DataCheck{OK: true,
		Rows:     &checkpoints.CheckRows{Total: 1345, Kept: 1340, Train: 1273, Eval: 67, LeftOut: 5},
		Tokens:   &checkpoints.CheckTokens{P50: 401, P90: 460, Max: 1010, MaxSeqLength: 1024},
		Steps:    &checkpoints.CheckSteps{PerEpoch: 20, Total: 60},
		Estimate: &checkpoints.CheckEstimate{Seconds: 518.6, GPUHours: 2.305, USD: 23.05}}
	for _, c := range []struct {
		check *runs.DataCheck
		want  string
	}{
		{nil, ""},
		{&runs.DataCheck{RayJob: "r-0"}, "running (RayJob r-0)"},
		{&runs.DataCheck{RayJob: "r-0", EndedAt: &now, Result: &checkpoints.DataCheck{Reason: "InvalidData"}}, "refused: InvalidData"},
		{&runs.DataCheck{RayJob: "r-0", EndedAt: &now, Result: passed},
			"passed: 1345 rows (1273 train, 67 held out, 5 left out) · tokens p50 401 p90 460 max 1010 of 1024 · 60 steps · about 8m39s, 2.3 GPU-hours, $23.05"},
	} {
		if got := CheckText(&runs.Record{Check: c.check}); got != c.want {
			t.Errorf("checkText = %q, want %q", got, c.want)
		}
	}
}
