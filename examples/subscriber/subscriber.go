// Package subscriber is an example subscriber to raydrop's public events, for
// a downstream team to copy and deploy: a Cloud Run function that, when a run
// succeeds, promotes the adapter of the run's best checkpoint to a stable
// <prefix>/<name>/latest/ folder of its own bucket, with a manifest.json that
// says which run, step and metrics the files came from.
//
// It is triggered by Eventarc from the raydrop-events Pub/Sub topic, so each
// raydrop CloudEvent arrives wrapped in a google.cloud.pubsub.topic.v1.messagePublished
// event (Unwrap); it also takes a raydrop event delivered as is, as an
// Eventarc Advanced bus delivers it. When a run's report is ready
// (dev.raydrop.run.v1.report_ready, after the run's terminal event) it logs
// where the report is (report_ready), for people to follow from the logs.
// Every other event is acknowledged and ignored.
//
// Promotion is idempotent and ordered (Handler.Promote): a redelivered event
// writes nothing, an older run's event never replaces a newer run's files,
// and two runs promoted at once end with the newer run's files and manifest
// only.
package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"cloud.google.com/go/storage"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// EntryPoint is the name the function is registered under: the entry point
// of its deployment and the FUNCTION_TARGET of a local process.
const EntryPoint = "PromoteAdapter"

// PubSubPublished is the type of the event Eventarc delivers for a Pub/Sub
// message.
const PubSubPublished = "google.cloud.pubsub.topic.v1.messagePublished"

// Succeeded is the type of the event whose run the subscriber promotes.
var Succeeded = events.Type(runs.Succeeded.Event())

// ReportReady is the type of the event that announces a run's report,
// which the subscriber logs.
var ReportReady = events.Type(events.ReportReady)

// Handler promotes the adapters of succeeded runs.
type Handler struct {
	// Storage reads the checkpoints and writes the destination bucket.
	Storage *storage.Client
	// Bucket receives the promoted files, under Prefix/<name>/latest/
	// (<name>/latest/ when Prefix is empty).
	Bucket string
	Prefix string
	// Log gets one line per event, with the run ID when there is one.
	Log *slog.Logger
}

// Handle promotes the run a succeeded event names, and acknowledges every
// other event. Its error is the platform's cue to deliver the event again,
// so it returns one only for a failure a later attempt may not meet (Cloud
// Storage unavailable, a write refused for the object's write rate); what no
// redelivery can fix (a malformed event, a checkpoint that does not hold the
// adapter) is logged and acknowledged.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	ev, err := Unwrap(e)
	if err != nil {
		return h.boundary(e, "", err)
	}
	if ev.Type() == ReportReady {
		return h.reportReady(ev)
	}
	if ev.Type() != Succeeded {
		h.Log.Info("event_ignored", "event_id", ev.ID(), "type", ev.Type(), "subject", ev.Subject())
		return nil
	}
	run, err := decodeRun(ev)
	if err != nil {
		return h.boundary(ev, run.RunID, err)
	}
	res, err := h.Promote(ctx, run, ev.ID())
	if err != nil {
		return h.boundary(ev, run.RunID, err)
	}
	attrs := []any{"run_id", run.RunID, "name", run.Name, "event_id", ev.ID(), "destination", h.folderURI(run.Name)}
	switch res.Outcome {
	case Promoted:
		h.Log.Info("adapter_promoted", append(attrs, "checkpoint", res.Manifest.CheckpointURI, "step", res.Manifest.Step)...)
	case Duplicate:
		h.Log.Info("duplicate_ignored", attrs...)
	case Superseded:
		h.Log.Info("older_run_ignored", append(attrs, "current_run_id", res.Current)...)
	}
	return nil
}

// reportReady logs where a run's report is, once it is written: the
// terminal event went out before it and names none.
func (h *Handler) reportReady(ev event.Event) error {
	var run events.Run
	if err := ev.DataAs(&run); err != nil {
		return h.boundary(ev, "", Permanent(fmt.Errorf("decode data of event %s: %w", ev.ID(), err)))
	}
	if !strings.HasPrefix(run.Report, "gs://") || run.RunID == "" {
		return h.boundary(ev, run.RunID, Permanent(fmt.Errorf("event %s: report %q of run %q is not a gs:// URI of a run", ev.ID(), run.Report, run.RunID)))
	}
	h.Log.Info("report_ready", "run_id", run.RunID, "name", run.Name, "outcome", run.Outcome, "report", run.Report, "event_id", ev.ID())
	return nil
}

// boundary logs a failure once and decides the reply: nil (acknowledged)
// for a permanent error, the error itself (delivered again with backoff)
// for the rest.
func (h *Handler) boundary(e event.Event, runID string, err error) error {
	attrs := []any{"event_id", e.ID(), "type", e.Type(), "error", err.Error()}
	if runID != "" {
		attrs = append(attrs, "run_id", runID)
	}
	if IsPermanent(err) {
		h.Log.Error("event_dropped", attrs...)
		return nil
	}
	h.Log.Warn("event_retry", attrs...)
	return err
}

// message is the data of a messagePublished event: the Pub/Sub message,
// its data base64-encoded in JSON. See
// https://cloud.google.com/eventarc/docs/cloudevents-json
type message struct {
	Message struct {
		Data       []byte            `json:"data"`
		Attributes map[string]string `json:"attributes"`
		MessageID  string            `json:"messageId"`
	} `json:"message"`
	Subscription string `json:"subscription"`
}

// Unwrap returns the raydrop CloudEvent e carries. raydrop publishes its
// events to Pub/Sub in the binary content mode of the CloudEvents Pub/Sub
// binding (context attributes as ce-* message attributes, the JSON data as
// the message data), and an Eventarc Pub/Sub trigger delivers each message
// as a messagePublished event whose data holds the message:
// events.FromPubSub rebuilds the event from it. Any other event is returned
// as it is: a raydrop event an Eventarc Advanced bus delivers directly, or
// one Handle ignores. A messagePublished event that does not hold a
// CloudEvent is a permanent error.
func Unwrap(e event.Event) (event.Event, error) {
	if e.Type() != PubSubPublished {
		return e, nil
	}
	var m message
	if err := json.Unmarshal(e.Data(), &m); err != nil {
		return e, Permanent(fmt.Errorf("decode the Pub/Sub message of event %s: %w", e.ID(), err))
	}
	if m.Message.Attributes["ce-type"] == "" {
		return e, Permanent(fmt.Errorf("message %s of event %s is not a CloudEvent in the Pub/Sub binary content mode (no ce-type attribute)", m.Message.MessageID, e.ID()))
	}
	ev, err := events.FromPubSub(m.Message.Attributes, m.Message.Data)
	if err != nil {
		return e, Permanent(fmt.Errorf("message %s of event %s is not a valid CloudEvent: %w", m.Message.MessageID, e.ID(), err))
	}
	return ev, nil
}

// nameRE is what a run name may be to name a folder: a Kubernetes label
// value, as raydrop's spec requires, and not empty.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// decodeRun decodes and checks a succeeded event's data.
func decodeRun(e event.Event) (events.Run, error) {
	var run events.Run
	if err := e.DataAs(&run); err != nil {
		return run, Permanent(fmt.Errorf("decode data of event %s: %w", e.ID(), err))
	}
	if err := check(run); err != nil {
		return run, Permanent(fmt.Errorf("event %s: %w", e.ID(), err))
	}
	return run, nil
}

// check reports everything that keeps a run from being promoted.
func check(run events.Run) error {
	var problems []error
	if msg := spec.CheckRunID(run.RunID); msg != "" {
		problems = append(problems, fmt.Errorf("runId %s", msg))
	}
	if !nameRE.MatchString(run.Name) {
		problems = append(problems, fmt.Errorf("name %q is not a label value that can name a folder", run.Name))
	}
	if run.EndedAt == nil || run.EndedAt.IsZero() {
		problems = append(problems, errors.New("endedAt is missing"))
	}
	if c := chosen(run); c == nil {
		problems = append(problems, errors.New("names neither a bestCheckpoint nor a latestCheckpoint"))
	} else if _, _, err := parseGS(c.URI); err != nil {
		problems = append(problems, err)
	}
	return errors.Join(problems...)
}

// chosen is the checkpoint a run promotes: its best, or its latest when the
// event names no best.
func chosen(run events.Run) *checkpoints.Checkpoint {
	if run.BestCheckpoint != nil {
		return run.BestCheckpoint
	}
	return run.LatestCheckpoint
}

// parseGS splits gs://bucket/folder into the bucket and the folder, without
// a trailing slash.
func parseGS(uri string) (bucket, folder string, err error) {
	rest, ok := strings.CutPrefix(uri, "gs://")
	bucket, folder, _ = strings.Cut(rest, "/")
	folder = strings.TrimSuffix(folder, "/")
	if !ok || bucket == "" || folder == "" {
		return "", "", fmt.Errorf("checkpoint uri %q is not gs://<bucket>/<folder>", uri)
	}
	return bucket, folder, nil
}

// permanent marks an error no redelivery can fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that Handle acknowledges the event.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}
