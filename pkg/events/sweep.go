package events

import (
	"fmt"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// SweepTypePrefix starts every sweep event type: dev.raydrop.sweep.v1.<phase>,
// with subject sweeps/<sweep ID>, once the sweep has ended.
const SweepTypePrefix = "dev.raydrop.sweep.v1."

// SweepSubjectPrefix begins a sweep event's subject.
const SweepSubjectPrefix = "sweeps/"

// SweepPhases are the phases of a sweep that have an event: its ends.
var SweepPhases = []string{sweeps.Succeeded.Event(), sweeps.Failed.Event(), sweeps.Cancelled.Event()}

// SweepType is the CloudEvent type of a sweep phase.
func SweepType(phase string) string { return SweepTypePrefix + phase }

// Sweep is the data of a sweep's terminal event: the best trial by
// held-out loss and its best checkpoint, and a table of every trial.
type Sweep struct {
	SweepID  string `json:"sweepId"`
	Name     string `json:"name"`
	Source   string `json:"source"`
	SpecHash string `json:"specHash"`
	Phase    string `json:"phase"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	// Best is the trial with the lowest held-out loss at its best
	// checkpoint; nil when no trial has one.
	Best   *SweepTrial  `json:"best,omitempty"`
	Trials []SweepTrial `json:"trials"`
	// StoppedEarly counts the trials the median rule stopped.
	StoppedEarly     int     `json:"stoppedEarly"`
	GPUHours         float64 `json:"gpuHours"`
	EstimatedCostUSD float64 `json:"estimatedCostUsd"`
	// Report is the gs:// URI of the sweep's report page.
	Report    string     `json:"report,omitempty"`
	StartedAt time.Time  `json:"startedAt"`
	EndedAt   *time.Time `json:"endedAt,omitempty"`
}

// SweepTrial is one row of a sweep's table.
type SweepTrial struct {
	Index  int               `json:"index"`
	RunID  string            `json:"runId"`
	Params []spec.ParamValue `json:"params"`
	// Outcome is the trial run's terminal phase (succeeded, failed,
	// cancelled, stopped, rejected), or notStarted.
	Outcome string      `json:"outcome"`
	Reason  runs.Reason `json:"reason,omitempty"`
	// Cause and Summary name why a trial that ended other than succeeded
	// did (the cause of its run's terminal event).
	Cause          string   `json:"cause,omitempty"`
	Summary        string   `json:"summary,omitempty"`
	BestEvalLoss   *float64 `json:"bestEvalLoss,omitempty"`
	BestCheckpoint string   `json:"bestCheckpoint,omitempty"`
	Steps          int64    `json:"steps"`
	GPUHours       float64  `json:"gpuHours"`
	CostUSD        float64  `json:"costUsd"`
}

// NotStarted is the outcome of a trial the sweep never started (it was
// cancelled, or its budget used, first).
const NotStarted = "notStarted"

// SweepData is the data of an ended sweep's event.
func SweepData(sw *sweeps.Record) Sweep {
	d := Sweep{SweepID: sw.SweepID, Name: sw.Name, Source: sw.Source, SpecHash: sw.SpecHash, Phase: sw.Phase.Event(),
		Reason: sw.Reason, Message: sw.Message, Report: sw.Report, StartedAt: sw.CreatedAt, EndedAt: sw.EndedAt, Trials: []SweepTrial{}}
	for _, t := range sw.Trials {
		row := SweepTrial{Index: t.Index, RunID: t.RunID, Params: t.Params, Outcome: NotStarted, Reason: t.Reason, Cause: t.Cause, Summary: t.Summary,
			BestEvalLoss: t.BestEvalLoss, BestCheckpoint: t.BestCheckpoint, Steps: t.Steps, GPUHours: t.GPUHours, CostUSD: t.CostUSD}
		if t.Ended != "" {
			row.Outcome = t.Ended.Event()
		}
		if t.Ended == runs.Stopped {
			d.StoppedEarly++
		}
		d.GPUHours += t.GPUHours
		d.EstimatedCostUSD += t.CostUSD
		d.Trials = append(d.Trials, row)
		if t.Index == sw.Best {
			best := row
			d.Best = &best
		}
	}
	return d
}

// NewSweep builds the CloudEvent of a sweep event. Its ID is the sweep and
// phase, so a subscriber can drop a redelivered copy.
func NewSweep(source string, data Sweep, at time.Time) (cloudevents.Event, error) {
	e := cloudevents.New(cloudevents.CloudEventsVersionV1)
	e.SetID(data.SweepID + "/" + data.Phase)
	e.SetType(SweepType(data.Phase))
	e.SetSource(source)
	e.SetSubject(SweepSubjectPrefix + data.SweepID)
	e.SetTime(at)
	if err := e.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return e, fmt.Errorf("encode sweep %s event: %w", data.Phase, err)
	}
	if err := e.Validate(); err != nil {
		return e, fmt.Errorf("invalid sweep %s event: %w", data.Phase, err)
	}
	return e, nil
}

// SweepSchemaID is the $id of the schema of a sweep phase's event data.
func SweepSchemaID(phase string) string {
	return "https://raydrop.dev/schemas/events/" + SweepType(phase) + ".json"
}

// SweepSchema returns the JSON Schema of the data of a sweep phase's event:
// every trial's row; a succeeded sweep names its best trial.
func SweepSchema(phase string) []byte {
	str := map[string]any{"type": "string"}
	id := map[string]any{"type": "string", "pattern": runIDPattern}
	number := map[string]any{"type": "number", "minimum": 0}
	params := map[string]any{"type": "array", "items": map[string]any{
		"type": "object", "additionalProperties": false, "required": []string{"path", "value"},
		"properties": map[string]any{
			"path":  map[string]any{"enum": spec.SweepPaths()},
			"value": map[string]any{"type": []string{"number", "string", "boolean"}},
		},
	}}
	var outcomes []string
	for _, p := range runs.Phases() {
		if p.Terminal() {
			outcomes = append(outcomes, p.Event())
		}
	}
	trial := map[string]any{
		"type": "object", "additionalProperties": false,
		"required": []string{"index", "runId", "params", "outcome", "steps", "gpuHours", "costUsd"},
		"properties": map[string]any{
			"index":          map[string]any{"type": "integer", "minimum": 1, "maximum": spec.MaxTrials},
			"runId":          id,
			"params":         params,
			"outcome":        map[string]any{"enum": append(outcomes, NotStarted), "description": "the trial run's terminal phase, or notStarted"},
			"reason":         reasonSchema(),
			"cause":          map[string]any{"enum": causeKinds(), "description": "why the trial ended other than succeeded, as its run's terminal event names it"},
			"summary":        map[string]any{"type": "string", "minLength": 1, "description": "the trial's cause in one line"},
			"bestEvalLoss":   map[string]any{"type": "number"},
			"bestCheckpoint": map[string]any{"type": "string", "minLength": 1},
			"steps":          map[string]any{"type": "integer", "minimum": 0},
			"gpuHours":       number,
			"costUsd":        number,
		},
	}
	required := []string{"sweepId", "name", "source", "specHash", "phase", "trials", "stoppedEarly", "gpuHours", "estimatedCostUsd", "startedAt", "endedAt"}
	switch phase {
	case sweeps.Succeeded.Event():
		required = append(required, "best")
	default:
		required = append(required, "reason", "message")
	}
	s := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  SweepSchemaID(phase),
		"title":                "data of a " + SweepType(phase) + " CloudEvent",
		"type":                 "object",
		"additionalProperties": false,
		"required":             required,
		"properties": map[string]any{
			"sweepId":          id,
			"name":             str,
			"source":           str,
			"specHash":         str,
			"phase":            map[string]any{"const": phase},
			"reason":           map[string]any{"type": "string", "minLength": 1, "description": "why the sweep ended as it did: Cancelled, NoTrialSucceeded, BudgetReached"},
			"message":          str,
			"best":             trial,
			"trials":           map[string]any{"type": "array", "items": trial, "minItems": 1, "maxItems": spec.MaxTrials},
			"stoppedEarly":     map[string]any{"type": "integer", "minimum": 0},
			"gpuHours":         number,
			"estimatedCostUsd": number,
			"report":           map[string]any{"type": "string", "pattern": "^gs://"},
			"startedAt":        map[string]any{"type": "string", "format": "date-time"},
			"endedAt":          map[string]any{"type": "string", "format": "date-time"},
		},
	}
	return encodeSchema(s)
}

// TrialRef names the sweep a run is a trial of, in the run's events.
type TrialRef struct {
	SweepID string            `json:"sweepId"`
	Index   int               `json:"index"`
	Params  []spec.ParamValue `json:"params"`
}

// IsSweepType reports whether an event type is a sweep event's.
func IsSweepType(t string) bool { return strings.HasPrefix(t, SweepTypePrefix) }
