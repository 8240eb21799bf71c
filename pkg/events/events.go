// Package events defines raydrop's public events: CloudEvents 1.0 of type
// dev.raydrop.run.v1.<phase> with subject runs/<id>, sent in the Pub/Sub
// binary binding (ce-* attributes, JSON data), and their JSON Schemas.
package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// TypePrefix starts every event type.
const TypePrefix = "dev.raydrop.run.v1."

// SubjectPrefix begins every event's subject: runs/<run ID>.
const SubjectPrefix = "runs/"

// Phases names every run event, in the order a run can meet them: those
// of the phases that have one, derived from the run's lifecycle
// (runs.Phases): accepted (or rejected, which ends it), queued (only a run
// that waits for its cluster), running, then one of succeeded, failed and
// cancelled (a run cancelled or failed before it ran skips running; one
// suspected stalled has a stalled event between running and its end); then
// report_ready, once the report of a run that ended is written (every run
// but a rejected one).
var Phases = func() []string {
	var out []string
	for _, p := range runs.Phases() {
		if e := p.Event(); e != "" {
			out = append(out, e)
		}
		if p == runs.Running {
			out = append(out, runs.StallSuspected.Event())
		}
	}
	return append(out, ReportReady)
}()

// Stalled is the event that announces the suspicion that a running
// attempt stopped making progress, once per attempt (its ID names the
// attempt: <run ID>/stalled_<n>). It goes out between running and the
// terminal event, and names no phase: the run stays RUNNING.
var Stalled = runs.StallSuspected.Event()

// Stall is a suspected stall, as the stalled event carries it.
type Stall struct {
	Step              int64     `json:"step"`
	Since             time.Time `json:"since"`
	SuspectedAt       time.Time `json:"suspectedAt"`
	WindowSeconds     float64   `json:"windowSeconds"`
	MedianStepSeconds float64   `json:"medianStepSeconds,omitempty"`
	Doing             string    `json:"doing,omitempty"`
	Behind            []int     `json:"behind,omitempty"`
}

// ReportReady is the event that announces a run's report, after its
// terminal event: the terminal event does not wait for the report.
var ReportReady = runs.ReportReady.Event()

// Terminal phases carry the run's results.
var Terminal = func() map[string]bool {
	out := map[string]bool{}
	for _, p := range runs.Phases() {
		if p.Terminal() && p.Event() != "" {
			out[p.Event()] = true
		}
	}
	return out
}()

// Type is the CloudEvent type of a phase.
func Type(phase string) string { return TypePrefix + phase }

// Run is the data of every run event. Terminal events fill the result fields.
type Run struct {
	RunID    string `json:"runId"`
	Name     string `json:"name"`
	Source   string `json:"source"`
	SpecHash string `json:"specHash,omitempty"`
	Phase    string `json:"phase"`
	// Reason is why the run is in the phase, for programs (runs.Reasons
	// lists them); Message says it for people.
	Reason   runs.Reason    `json:"reason,omitempty"`
	Message  string         `json:"message,omitempty"`
	Problems []spec.Problem `json:"problems,omitempty"`
	Attempt  int            `json:"attempt,omitempty"`
	Cluster  string         `json:"cluster,omitempty"`
	// Trial names the sweep the run is a trial of.
	Trial *TrialRef `json:"trial,omitempty"`
	// Capacity is where the attempt's GPU workers came from (running and
	// terminal events).
	Capacity *Capacity `json:"capacity,omitempty"`
	// Startup is how the current attempt's GPU workers came up (running
	// and terminal events, once the monitor has seen them all run).
	Startup *Startup `json:"startup,omitempty"`
	// Images are the Ray containers' images (every event of an admitted
	// run): the deployment's trainer image by digest, so that the run can
	// be reproduced, or the images the spec named.
	Images *Images `json:"images,omitempty"`
	// Model is the base model's revision, pinned by commit, and its staged
	// copy in the deployment's bucket (every event from the submission of
	// the first attempt on, where the deployment stages models).
	Model *runs.Model `json:"model,omitempty"`

	Checkpoints      []checkpoints.Checkpoint `json:"checkpoints,omitempty"`
	LatestCheckpoint *checkpoints.Checkpoint  `json:"latestCheckpoint,omitempty"`
	BestCheckpoint   *checkpoints.Checkpoint  `json:"bestCheckpoint,omitempty"`
	// BestBy is the metric bestCheckpoint was chosen by: eval_loss (the loss
	// on the held-out rows) when the checkpoints have it, else loss.
	BestBy       string             `json:"bestBy,omitempty"`
	FinalMetrics map[string]float64 `json:"finalMetrics,omitempty"`
	// Data is what the length filter made of the dataset: its rows, and
	// those left out as longer than the spec's maxSeqLength.
	Data *checkpoints.DataStats `json:"data,omitempty"`
	// Samples locates the tuned and base model's answers to held-out rows.
	Samples *checkpoints.Samples `json:"samples,omitempty"`
	// DataCheck is what the data check found, once it has (a spec with
	// dataset.check): in the checking event's successors and the terminal
	// event.
	DataCheck *checkpoints.DataCheck `json:"dataCheck,omitempty"`
	// Report is the gs:// URI of the run's report: one self-contained HTML
	// page with its curves, timeline, checkpoints, samples and cost. The
	// report_ready event carries it; a terminal event only when the report
	// was written before it went out.
	Report string `json:"report,omitempty"`
	// Evidence is the gs:// URI of the run's evidence folder
	// (pkg/evidence), once kept: terminal and report_ready events.
	Evidence string `json:"evidence,omitempty"`
	// Cause names why a failed or cancelled run ended (pkg/cause),
	// Summary says it in one line and Hint what to change: terminal and
	// report_ready events of runs finalize concluded.
	Cause   string `json:"cause,omitempty"`
	Summary string `json:"summary,omitempty"`
	Hint    string `json:"hint,omitempty"`
	// Outcome is how the run ended, the phase of its terminal event
	// (report_ready events).
	Outcome string `json:"outcome,omitempty"`
	// Stall is the current attempt's suspected stall (stalled events).
	Stall *Stall `json:"stall,omitempty"`

	// Timings is the seconds spent in each phase, by phase name.
	Timings          map[string]float64 `json:"timings,omitempty"`
	GPUHours         *float64           `json:"gpuHours,omitempty"`
	EstimatedCostUSD *float64           `json:"estimatedCostUsd,omitempty"`
	StartedAt        *time.Time         `json:"startedAt,omitempty"`
	EndedAt          *time.Time         `json:"endedAt,omitempty"`
}

// Images are the images a run's Ray containers run.
type Images struct {
	Head    string `json:"head"`
	Workers string `json:"workers"`
	// Trainer: both are the deployment's trainer image, whose locked
	// dependencies are installed (trainer/image): the runtime env installs
	// nothing. False: the runtime env pip-installs trainer/requirements.txt.
	Trainer bool `json:"trainer"`
}

// Startup is how an attempt's GPU workers came up, read from their pods:
// from the attempt's RayJob until the last worker pod was bound to a node
// (waiting for GKE to create or find GPU nodes), then until the last one's
// containers started (pulling the image and creating the container), then,
// once the trainer has reported, until the end of its first optimizer step
// (to its first report when it gave no account of its start), split by the
// trainer's own account into Ray's runtime env, the weights, the data and
// the rest. Workers kept from an earlier attempt or run count nothing.
type Startup struct {
	NodesSeconds     float64  `json:"nodesSeconds"`
	ImageSeconds     float64  `json:"imageSeconds"`
	FirstStepSeconds *float64 `json:"firstStepSeconds,omitempty"`
	// The trainer's own split of FirstStepSeconds, when it gave one
	// (runs.TrainerParts).
	RuntimeEnvSeconds *float64 `json:"runtimeEnvSeconds,omitempty"`
	WeightsSeconds    *float64 `json:"weightsSeconds,omitempty"`
	DataSeconds       *float64 `json:"dataSeconds,omitempty"`
	StepSeconds       *float64 `json:"stepSeconds,omitempty"`
	// Seconds is their sum (also timings.startup in a terminal event).
	Seconds float64 `json:"seconds"`
}

// Capacity is where an attempt's GPU workers came from.
type Capacity struct {
	// Tier is the capacity tier the workers were asked on ("spot",
	// "reservation b200-reservation"); Type is its type, Index its place in
	// the spec's cluster.capacity, from 1.
	Tier  string `json:"tier"`
	Type  string `json:"type"`
	Index int    `json:"index"`
	// Served says every worker the attempt needs ran on it; WaitSeconds is
	// how long the attempt waited for that (for one never served, until it
	// ended), and Waiting why it waited while it did.
	Served      bool    `json:"served"`
	WaitSeconds float64 `json:"waitSeconds"`
	Waiting     string  `json:"waiting,omitempty"`
	// Preemptions is how many of the run's attempts were lost to
	// preemption so far; none counts against limits.retries.
	Preemptions int `json:"preemptions"`
}

// New builds the CloudEvent of a run event. Its ID is the run and phase,
// so a subscriber can drop a redelivered copy.
func New(source string, data Run, at time.Time) (cloudevents.Event, error) {
	e := cloudevents.New(cloudevents.CloudEventsVersionV1)
	id := data.RunID + "/" + data.Phase
	if data.Phase == Stalled {
		id += fmt.Sprintf("_%d", data.Attempt)
	}
	e.SetID(id)
	e.SetType(Type(data.Phase))
	e.SetSource(source)
	e.SetSubject(SubjectPrefix + data.RunID)
	e.SetTime(at)
	if err := e.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return e, fmt.Errorf("encode %s event: %w", data.Phase, err)
	}
	if err := e.Validate(); err != nil {
		return e, fmt.Errorf("invalid %s event: %w", data.Phase, err)
	}
	return e, nil
}

// PubSubAttributes maps a CloudEvent to the attributes of the Pub/Sub
// binary content mode: every context attribute as ce-<name>, and the data
// content type as content-type.
func PubSubAttributes(e cloudevents.Event) map[string]string {
	attrs := map[string]string{
		"ce-specversion": e.SpecVersion(),
		"ce-id":          e.ID(),
		"ce-type":        e.Type(),
		"ce-source":      e.Source(),
		"content-type":   e.DataContentType(),
	}
	if s := e.Subject(); s != "" {
		attrs["ce-subject"] = s
	}
	if !e.Time().IsZero() {
		attrs["ce-time"] = e.Time().UTC().Format(time.RFC3339Nano)
	}
	for k, v := range e.Extensions() {
		attrs["ce-"+k] = fmt.Sprint(v)
	}
	return attrs
}

// FromPubSub rebuilds a CloudEvent from a Pub/Sub message in the binary
// content mode.
func FromPubSub(attrs map[string]string, data []byte) (cloudevents.Event, error) {
	e := cloudevents.New(attrs["ce-specversion"])
	for k, v := range attrs {
		name, ok := strings.CutPrefix(k, "ce-")
		if !ok || name == "specversion" {
			continue
		}
		switch name {
		case "id":
			e.SetID(v)
		case "type":
			e.SetType(v)
		case "source":
			e.SetSource(v)
		case "subject":
			e.SetSubject(v)
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return e, fmt.Errorf("ce-time %q: %w", v, err)
			}
			e.SetTime(t)
		default:
			e.SetExtension(name, v)
		}
	}
	if err := e.SetData(attrs["content-type"], json.RawMessage(data)); err != nil {
		return e, err
	}
	return e, e.Validate()
}
