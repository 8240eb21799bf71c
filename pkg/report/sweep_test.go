package report

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// TestSweepReportNamesTheCauseOfAFailedTrial: a failed trial's row says
// why it failed.
func TestSweepReportNamesTheCauseOfAFailedTrial(t *testing.T) {
	created := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ended := created.Add(time.Hour)
	loss := 0.41
	sw := &sweeps.Record{
		SweepID: "lr-grid-0123456789ab", Name: "lr-grid", Source: "gs://i/jobs/lr-grid.json#1", SpecHash: "sha256:0",
		Phase: sweeps.Succeeded, CreatedAt: created, EndedAt: &ended, Best: 1, Message: "2 of 2 trials ran",
		Trials: []sweeps.Trial{
			{Index: 1, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 1), Params: []spec.ParamValue{{Path: "lora.r", Value: 16}},
				Ended: runs.Succeeded, BestEvalLoss: &loss, BestCheckpoint: "gs://o/t1/attempt-1/checkpoint_000002", Steps: 40, GPUHours: 2.5, CostUSD: 25},
			{Index: 2, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 2), Params: []spec.ParamValue{{Path: "lora.r", Value: 64}},
				Ended: runs.Failed, Reason: runs.ApplicationError, Cause: "CudaOutOfMemory", Summary: "CUDA out of memory after step 4 on rank 3", Steps: 4},
		},
	}
	b, err := os.ReadFile("../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	if sw.Spec, err = spec.Parse(b); err != nil {
		t.Fatal(err)
	}
	page, err := RenderSweep(sw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), `<div class="cause"><strong>CudaOutOfMemory</strong>: CUDA out of memory after step 4 on rank 3</div>`) {
		t.Errorf("the failed trial's row does not name its cause:\n%s", page)
	}
}
