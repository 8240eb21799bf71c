package events_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// compileSweep compiles the schema of a sweep phase's event data.
func compileSweep(t *testing.T, phase string) *jsonschema.Schema {
	t.Helper()
	return compileDoc(t, events.SweepSchemaID(phase), events.SweepSchema(phase))
}

// TestSweepEventsValidate: the event of every sweep phase, built from a
// record as finalize builds it, matches its schema; a succeeded sweep's
// without its best trial does not.
func TestSweepEventsValidate(t *testing.T) {
	created := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ended := created.Add(time.Hour)
	loss := func(v float64) *float64 { return &v }
	record := func(phase sweeps.Phase) *sweeps.Record {
		sw := &sweeps.Record{
			SweepID: "lr-grid-0123456789ab", Name: "lr-grid", Source: "gs://i/jobs/lr-grid.json#1", SpecHash: "sha256:0",
			Phase: phase, CreatedAt: created, EndedAt: &ended,
			Trials: []sweeps.Trial{
				{Index: 1, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 1), Params: []spec.ParamValue{{Path: "training.learningRate", Value: 0.0002}, {Path: "lora.r", Value: 16}},
					Ended: runs.Succeeded, BestEvalLoss: loss(0.41), BestCheckpoint: "gs://o/lr-grid-0123456789ab-t001/attempt-1/checkpoint_000002", Steps: 40, GPUHours: 2.5, CostUSD: 25},
				{Index: 2, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 2), Params: []spec.ParamValue{{Path: "training.learningRate", Value: 0.001}, {Path: "lora.r", Value: 16}},
					Ended: runs.Stopped, Reason: runs.EarlyStopped, BestEvalLoss: loss(0.9), BestCheckpoint: "gs://o/lr-grid-0123456789ab-t002/attempt-1/checkpoint_000000", Steps: 10, GPUHours: 0.6, CostUSD: 6},
				{Index: 3, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 3), Params: []spec.ParamValue{{Path: "training.learningRate", Value: 0.00005}, {Path: "lora.r", Value: 16}}},
				{Index: 4, RunID: sweeps.TrialRunID("lr-grid-0123456789ab", 4), Params: []spec.ParamValue{{Path: "training.learningRate", Value: 0.0002}, {Path: "lora.r", Value: 64}},
					Ended: runs.Failed, Reason: runs.ApplicationError, Cause: "CudaOutOfMemory", Summary: "CUDA out of memory after step 4 on rank 3"},
			},
		}
		switch phase {
		case sweeps.Succeeded:
			sw.Best, sw.Message = 1, "2 of 3 trials ran"
		case sweeps.Failed:
			sw.Reason, sw.Message = "NoTrialSucceeded", "none of the 2 trials that ran left a checkpoint"
		case sweeps.Cancelled:
			sw.Reason, sw.Message = "Cancelled", "cancelled: 2 of 3 trials ran"
		}
		return sw
	}
	for _, p := range []sweeps.Phase{sweeps.Succeeded, sweeps.Failed, sweeps.Cancelled} {
		d := events.SweepData(record(p))
		e, err := events.NewSweep("//raydrop.dev/test", d, ended)
		if err != nil {
			t.Fatal(err)
		}
		if e.Type() != events.SweepType(p.Event()) || e.Subject() != events.SweepSubjectPrefix+d.SweepID {
			t.Errorf("%s: type %s, subject %s", p, e.Type(), e.Subject())
		}
		if d.StoppedEarly != 1 || d.Trials[2].Outcome != events.NotStarted || d.GPUHours != 3.1 || d.Trials[3].Cause != "CudaOutOfMemory" {
			t.Errorf("%s: stopped early %d, trial 3 %s, GPU-hours %v", p, d.StoppedEarly, d.Trials[2].Outcome, d.GPUHours)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(e.Data()))
		if err != nil {
			t.Fatal(err)
		}
		if err := compileSweep(t, p.Event()).Validate(inst); err != nil {
			t.Errorf("%s: %v\n%s", p, err, e.Data())
		}
	}
	// Succeeded without its best trial.
	sw := record(sweeps.Succeeded)
	sw.Best = 0
	b, _ := json.Marshal(events.SweepData(sw))
	inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if compileSweep(t, sweeps.Succeeded.Event()).Validate(inst) == nil {
		t.Error("a succeeded sweep's event without its best trial matches the schema")
	}
}
