package events

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// runIDPattern is a run (or sweep) ID: names.MaxRunIDLength characters.
const runIDPattern = "^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"

// SchemaID is the $id of the schema of a phase's event data.
func SchemaID(phase string) string {
	return "https://raydrop.dev/schemas/events/" + Type(phase) + ".json"
}

// Schema returns the JSON Schema (draft 2020-12) of the data of a phase's
// event. Every terminal event has its end time; a succeeded event names
// its checkpoints, the latest and best, final metrics, timings, GPU-hours and
// cost; a failed, cancelled or rejected one (and a queued one) names its
// reason and message.
func Schema(phase string) []byte {
	checkpoint := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"name", "uri", "step", "epoch", "metrics", "complete"},
		"properties": map[string]any{
			"name":     map[string]any{"type": "string", "pattern": "^checkpoint_[0-9]{6}$"},
			"uri":      map[string]any{"type": "string", "minLength": 1},
			"step":     map[string]any{"type": "integer", "minimum": 0},
			"epoch":    map[string]any{"type": "number", "minimum": 0},
			"metrics":  numberMap(),
			"complete": map[string]any{"type": "boolean"},
		},
	}
	str := map[string]any{"type": "string"}
	props := map[string]any{
		"runId": map[string]any{"type": "string", "pattern": runIDPattern},
		"trial": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"sweepId", "index", "params"},
			"description": "the sweep the run is a trial of: its ID, the trial's number, the values of the sweep's parameters",
			"properties": map[string]any{
				"sweepId": map[string]any{"type": "string", "pattern": runIDPattern},
				"index":   map[string]any{"type": "integer", "minimum": 1, "maximum": spec.MaxTrials},
				"params": map[string]any{"type": "array", "items": map[string]any{
					"type": "object", "additionalProperties": false, "required": []string{"path", "value"},
					"properties": map[string]any{"path": map[string]any{"enum": spec.SweepPaths()}, "value": map[string]any{"type": []string{"number", "string", "boolean"}}},
				}},
			},
		},
		"name":     str,
		"source":   str,
		"specHash": str,
		"phase":    map[string]any{"const": phase},
		"reason":   reasonSchema(),
		"message":  str,
		"problems": map[string]any{"type": "array", "items": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"path", "message"},
			"properties": map[string]any{"path": str, "message": str},
		}},
		"attempt":          map[string]any{"type": "integer", "minimum": 1},
		"cluster":          str,
		"checkpoints":      map[string]any{"type": "array", "items": checkpoint},
		"latestCheckpoint": checkpoint,
		"bestCheckpoint":   checkpoint,
		"bestBy":           map[string]any{"enum": []string{"eval_loss", "loss"}, "description": "the metric bestCheckpoint was chosen by: eval_loss (held-out rows) when the checkpoints have it, else the training loss"},
		"finalMetrics":     numberMap(),
		"data": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"rows", "droppedRows", "maxSeqLength", "evalRows"},
			"properties": map[string]any{
				"rows":         map[string]any{"type": "integer", "minimum": 0},
				"droppedRows":  map[string]any{"type": "integer", "minimum": 0},
				"maxSeqLength": map[string]any{"type": "integer", "minimum": 1},
				"evalRows":     map[string]any{"type": "integer", "minimum": 0},
			},
		},
		"samples": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"uri", "count", "seconds"},
			"description": "the tuned and the base model's answers to held-out rows (samples.json), and the seconds generating them took (also timings.sampleAnswers)",
			"properties": map[string]any{
				"uri":     map[string]any{"type": "string", "minLength": 1},
				"count":   map[string]any{"type": "integer", "minimum": 0},
				"seconds": map[string]any{"type": "number", "minimum": 0},
			},
		},
		"dataCheck": dataCheckSchema(),
		"images": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"head", "workers", "trainer"},
			"description": "the images the run's Ray containers run (the deployment's trainer image by digest where the spec named none); trainer: both are the trainer image (trainer/image), so the runtime env installed nothing, else it pip-installed the trainer's requirements on every node",
			"properties": map[string]any{
				"head":    str,
				"workers": str,
				"trainer": map[string]any{"type": "boolean"},
			},
		},
		"model": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"repo", "revision", "commit", "uri", "stagedBy", "staged"},
			"description": "the base model: the Hub revision the spec asked for, the commit it was resolved to when the first attempt was submitted (every attempt trains from it), and its copy in the deployment's bucket, staged once per commit by stagedBy; staged: the copy was complete when the attempt was submitted (false: this run, or stagedBy, copies it from the Hub as the attempt starts)",
			"properties": map[string]any{
				"repo":     map[string]any{"type": "string", "minLength": 1},
				"revision": map[string]any{"type": "string", "minLength": 1},
				"commit":   map[string]any{"type": "string", "pattern": "^[0-9a-f]{40}$"},
				"uri":      map[string]any{"type": "string", "pattern": "^gs://[^/]+/.+$"},
				"stagedBy": map[string]any{"type": "string", "minLength": 1},
				"staged":   map[string]any{"type": "boolean"},
			},
		},
		"report":   map[string]any{"type": "string", "pattern": "^gs://[^/]+/.+[.]html$", "description": "the run's report: one self-contained HTML page (curves, timeline, checkpoints, sample answers, cost); the report_ready event carries it, a terminal event only when the report was written before it went out (subscribers that want the report wait for report_ready)"},
		"evidence": map[string]any{"type": "string", "pattern": "^gs://[^/]+/.+/evidence/$", "description": "the run's evidence folder, kept before its GPU workers were scaled down: for each attempt (attempt-<n>/), every Ray pod's and the submitter pod's container logs, the pods' statuses, the Kubernetes events of the run's objects, and a manifest.json of what was kept and what could not be (terminal and report_ready events of runs that had an attempt on a cluster)"},
		"cause":    map[string]any{"enum": causeKinds(), "description": "why the run ended other than succeeded, named from its reason, its trainer's mark and its evidence: OOMKilled (a container ended at its memory limit), HostOutOfMemory (Ray's memory monitor killed a worker), CudaOutOfMemory, NcclTimeout (a collective timed out), NcclError, GpuError (a CUDA device error such as an illegal memory access or an ECC error), ImagePull, DataError, PythonException (any other exception of the training code), Preempted, Stalled, DeadlineExceeded, Cancelled or Unknown (terminal and report_ready events of runs that ended other than succeeded; absent from events of earlier versions)"},
		"summary":  map[string]any{"type": "string", "minLength": 1, "description": "the cause in one line, with the rank, pod and step where known"},
		"hint":     map[string]any{"type": "string", "description": "what to change, naming the job spec's fields"},
		"stall": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"step", "since", "suspectedAt", "windowSeconds"},
			"description": "the attempt's suspected stall (stalled events only): no rank ended a step, nor began an evaluation or a save, from since to suspectedAt, longer than the window (the longer of limits.stallAfter and limits.stallFactor median steps), read in the ranks' heartbeats",
			"properties": map[string]any{
				"step":              map[string]any{"type": "integer", "minimum": 0, "description": "the last step any rank ended"},
				"since":             map[string]any{"type": "string", "format": "date-time", "description": "the ranks' last sign of progress"},
				"suspectedAt":       map[string]any{"type": "string", "format": "date-time"},
				"windowSeconds":     map[string]any{"type": "number", "exclusiveMinimum": 0},
				"medianStepSeconds": map[string]any{"type": "number", "minimum": 0},
				"doing":             map[string]any{"type": "string", "description": "what the ranks that moved last said they were doing: training, evaluating, saving, sampling"},
				"behind":            map[string]any{"type": "array", "items": map[string]any{"type": "integer", "minimum": 0}, "description": "ranks whose last step is before step: those that hold the others up"},
			},
		},
		"outcome": map[string]any{"enum": terminalEvents(), "description": "how the run ended: the phase of its terminal event, which went out before this one (report_ready events only)"},
		"capacity": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"tier", "type", "index", "served", "waitSeconds", "preemptions"},
			"description": "where the attempt's GPU workers came from: the capacity tier they were asked on, whether it served them, how long they waited, and the attempts the run lost to preemption",
			"properties": map[string]any{
				"tier":        map[string]any{"type": "string", "minLength": 1},
				"type":        map[string]any{"enum": spec.TierTypes},
				"index":       map[string]any{"type": "integer", "minimum": 1},
				"served":      map[string]any{"type": "boolean"},
				"waitSeconds": map[string]any{"type": "number", "minimum": 0},
				"waiting":     map[string]any{"type": "string"},
				"preemptions": map[string]any{"type": "integer", "minimum": 0},
			},
		},
		"startup": map[string]any{
			"type": "object", "additionalProperties": false, "required": []string{"nodesSeconds", "imageSeconds", "seconds"},
			"description": "how the attempt's GPU workers came up, from their pods: from the attempt's RayJob until the last worker pod was bound to a node (waiting for GPU nodes), then until the last one's containers started (image pull and container start), then, once the trainer has reported, until the end of its first optimizer step (firstStepSeconds; to its first report when it gave no account of its start), which the trainer's own account splits into runtimeEnvSeconds (Ray's runtime env and worker processes, until its train function began), weightsSeconds (the base model: its staging by the driver, the node's copy, or the Hub, and loading it), dataSeconds (processor, rows, length filter) and stepSeconds (the rest, the first step included); seconds is their sum, also timings.startup",
			"properties": map[string]any{
				"nodesSeconds":      map[string]any{"type": "number", "minimum": 0},
				"imageSeconds":      map[string]any{"type": "number", "minimum": 0},
				"firstStepSeconds":  map[string]any{"type": "number", "minimum": 0},
				"runtimeEnvSeconds": map[string]any{"type": "number", "minimum": 0},
				"weightsSeconds":    map[string]any{"type": "number", "minimum": 0},
				"dataSeconds":       map[string]any{"type": "number", "minimum": 0},
				"stepSeconds":       map[string]any{"type": "number", "minimum": 0},
				"seconds":           map[string]any{"type": "number", "minimum": 0},
			},
		},
		"timings":          numberMap(),
		"gpuHours":         map[string]any{"type": "number", "minimum": 0},
		"estimatedCostUsd": map[string]any{"type": "number", "minimum": 0},
		"startedAt":        map[string]any{"type": "string", "format": "date-time"},
		"endedAt":          map[string]any{"type": "string", "format": "date-time"},
	}
	required := []string{"runId", "name", "source", "phase"}
	if Terminal[phase] {
		required = append(required, "endedAt")
	}
	if phase != ReportReady {
		delete(props, "outcome")
	}
	if phase != Stalled {
		delete(props, "stall")
	}
	switch phase {
	case "succeeded":
		required = append(required, "checkpoints", "latestCheckpoint", "bestCheckpoint", "finalMetrics", "timings", "gpuHours", "estimatedCostUsd", "attempt")
		props["checkpoints"].(map[string]any)["minItems"] = 1
	case "failed", "cancelled", "rejected", "queued", "stopped":
		required = append(required, "reason", "message")
	case ReportReady:
		required = append(required, "report", "outcome", "endedAt")
	case Stalled:
		required = append(required, "stall", "message", "attempt")
	}
	s := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  SchemaID(phase),
		"title":                "data of a " + Type(phase) + " CloudEvent",
		"type":                 "object",
		"additionalProperties": false,
		"required":             required,
		"properties":           props,
	}
	return encodeSchema(s)
}

// EnvelopeID is the $id of the schema of a whole event in the CloudEvents
// JSON format (structured content mode), as `raydrop events --json` prints it.
const EnvelopeID = "https://raydrop.dev/schemas/events/cloudevent.json"

// EnvelopeSchema returns the JSON Schema of a raydrop event as a
// structured-mode CloudEvent (CloudEvents 1.0, JSON event format): the
// context attributes raydrop sets and, by type, the data's own schema.
// https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md
func EnvelopeSchema() []byte {
	var types []string
	var byType []any
	add := func(typ string) {
		types = append(types, typ)
		byType = append(byType, map[string]any{
			"if":   map[string]any{"properties": map[string]any{"type": map[string]any{"const": typ}}},
			"then": map[string]any{"properties": map[string]any{"data": map[string]any{"$ref": typ + ".json"}}},
		})
	}
	for _, p := range Phases {
		add(Type(p))
	}
	for _, p := range SweepPhases {
		add(SweepType(p))
	}
	id := strings.Trim(runIDPattern, "^$")
	str := map[string]any{"type": "string", "minLength": 1}
	s := map[string]any{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         EnvelopeID,
		"title":       "a raydrop run or sweep event as a structured-mode CloudEvent (CloudEvents 1.0, JSON format)",
		"description": "Extension attributes other than those listed may appear; consumers ignore them.",
		"type":        "object",
		"required":    []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data"},
		"properties": map[string]any{
			"specversion":     map[string]any{"const": "1.0"},
			"id":              map[string]any{"type": "string", "pattern": "^" + id + "/[a-z_]+[0-9]*$", "description": "<run or sweep ID>/<phase> (or /report_ready, or /stalled_<attempt>): the same for a redelivered copy"},
			"source":          str,
			"type":            map[string]any{"enum": types},
			"subject":         map[string]any{"type": "string", "pattern": "^(" + SubjectPrefix + "|" + SweepSubjectPrefix + ")" + id + "$"},
			"time":            map[string]any{"type": "string", "format": "date-time"},
			"datacontenttype": map[string]any{"const": "application/json"},
			"data":            map[string]any{"type": "object"},
		},
		"allOf": byType,
	}
	return encodeSchema(s)
}

func encodeSchema(s map[string]any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// reasonSchema documents every reason a run event can carry.
func reasonSchema() map[string]any {
	rs := runs.Reasons()
	keys := make([]string, 0, len(rs))
	for r := range rs {
		keys = append(keys, string(r))
	}
	sort.Strings(keys)
	var one []any
	for _, k := range keys {
		one = append(one, map[string]any{"const": k, "description": rs[runs.Reason(k)]})
	}
	return map[string]any{"description": "why the run is in this phase, for programs; message says it for people", "oneOf": one}
}

// terminalEvents are the terminal phases' events, sorted.
// causeKinds are the causes pkg/cause names.
func causeKinds() []string {
	out := make([]string, len(cause.Kinds))
	for i, k := range cause.Kinds {
		out[i] = string(k)
	}
	return out
}

func terminalEvents() []string { return slices.Sorted(maps.Keys(Terminal)) }

func numberMap() map[string]any {
	return map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "number"}}
}

// dataCheckSchema is the data check's figures (checkpoints.DataCheck).
func dataCheckSchema() map[string]any {
	count := map[string]any{"type": "integer", "minimum": 0}
	number := map[string]any{"type": "number", "minimum": 0}
	object := func(required []string, props map[string]any) map[string]any {
		return map[string]any{"type": "object", "additionalProperties": false, "required": required, "properties": props}
	}
	counts := map[string]any{"type": "object", "additionalProperties": count}
	return map[string]any{
		"type": "object", "additionalProperties": false, "required": []string{"ok"},
		"description": "what the data check found before any GPU worker was asked for (trainer/datacheck.py; data-check.json beside the run): its verdict, the rows, the rows left out by cause, token lengths and totals, images, optimizer steps and the estimate of the training time and price",
		"properties": map[string]any{
			"ok":      map[string]any{"type": "boolean"},
			"reason":  map[string]any{"enum": []string{"InvalidData", "InvalidModel"}},
			"message": map[string]any{"type": "string"},
			"dataset": map[string]any{"type": "object", "additionalProperties": true, "required": []string{"source", "split"},
				"description": "the data the check read; resolvedRevision is the Hub commit its revision pointed at, which training then reads",
				"properties": map[string]any{"source": map[string]any{"type": "string"}, "split": map[string]any{"type": "string"},
					"revision": map[string]any{"type": "string"}, "resolvedRevision": map[string]any{"type": "string"}}},
			"rows":    object([]string{"total", "kept", "train", "eval", "leftOut"}, map[string]any{"total": count, "kept": count, "train": count, "eval": count, "leftOut": count}),
			"leftOut": counts,
			"tokens": object([]string{"p50", "p90", "max", "maxSeqLength", "answer", "train", "eval"}, map[string]any{
				"p50": count, "p90": count, "max": count, "maxSeqLength": count, "answer": count, "train": count, "eval": count}),
			"images":   object([]string{"total"}, map[string]any{"total": count, "perRow": counts}),
			"steps":    object([]string{"perEpoch", "total"}, map[string]any{"perEpoch": count, "total": count}),
			"estimate": object([]string{"seconds", "gpuHours", "usd"}, map[string]any{"seconds": number, "gpuHours": number, "usd": number}),
			"seconds":  number,
		},
	}
}
