// Package provision is the Provision function: it takes a job spec from the
// intake bucket (jobs/<name>.json) or the requests topic, records the run,
// and brings its RayCluster up, or queues the run behind the one that holds
// the cluster. Cancellation requests (an object cancel/<runId> or a message
// with attribute action=cancel) come in the same way.
package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// Handler handles intake events.
type Handler struct{ Deps *pipeline.Deps }

// Handle handles one event; see the package comment.
func (h *Handler) Handle(ctx context.Context, e event.Event) error {
	switch e.Type() {
	case pipeline.StorageFinalized:
		return h.fromObject(ctx, e)
	case pipeline.PubSubPublished:
		return h.fromMessage(ctx, e)
	default:
		return pipeline.Permanent(fmt.Errorf("unexpected event type %q from %s (want %s or %s)", e.Type(), e.Source(), pipeline.StorageFinalized, pipeline.PubSubPublished))
	}
}

func (h *Handler) fromObject(ctx context.Context, e event.Event) error {
	o, err := pipeline.DecodeObject(e)
	if err != nil {
		return err
	}
	if o.Bucket != h.Deps.Config.IntakeBucket {
		h.Deps.Log.Warn("object_ignored", "bucket", o.Bucket, "object", o.Name, "why", "not the intake bucket")
		return nil
	}
	if id, ok := strings.CutPrefix(o.Name, "cancel/"); ok && !strings.Contains(id, "/") {
		return h.cancel(ctx, id, fmt.Sprintf("gs://%s/%s", o.Bucket, o.Name))
	}
	// Only a .json object under jobs/ starts a run; anything else is
	// ignored (and logged), so nothing the pipeline could write loops.
	if !specObject(o.Name) {
		log := h.Deps.Log.Warn
		if h.Deps.Config.StateBucket == o.Bucket && slices.ContainsFunc(runs.StatePrefixes, func(p string) bool { return strings.HasPrefix(o.Name, p) }) {
			log = h.Deps.Log.Debug // the pipeline's own state, in a deployment without a state bucket
		}
		log("object_ignored", "bucket", o.Bucket, "object", o.Name, "why", "not a job spec: specs are .json objects under jobs/ (sub-folders too), with no empty, . or .. folder")
		return nil
	}
	runID := names.RunIDFromObject(o.Bucket, o.Name, int64(o.Generation))
	source := fmt.Sprintf("gs://%s/%s#%d", o.Bucket, o.Name, o.Generation)
	data, _, err := h.Deps.Objects.Read(ctx, o.Bucket, o.Name, spec.MaxBytes)
	switch {
	case errors.Is(err, checkpoints.ErrNotFound):
		h.Deps.Log.Warn("object_ignored", "bucket", o.Bucket, "object", o.Name, "why", "deleted before it was read")
		return nil
	case errors.Is(err, gcp.ErrTooLarge):
		data = nil // Parse reports the size problem below
	case err != nil:
		return err
	}
	return h.intake(ctx, runID, source, names.SpecName(o.Name), data, int64(o.Size))
}

// specObject reports whether an intake object is a job spec: a .json
// object under jobs/, in any sub-folder (teams keep their specs in
// folders: jobs/team-a/x.json runs), with no empty, "." or ".." folder.
func specObject(name string) bool {
	rest, ok := strings.CutPrefix(name, "jobs/")
	if !ok || !strings.HasSuffix(rest, ".json") {
		return false
	}
	for _, seg := range strings.Split(rest, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func (h *Handler) fromMessage(ctx context.Context, e event.Event) error {
	m, err := pipeline.DecodeMessage(e)
	if err != nil {
		return err
	}
	attrs := m.Message.Attributes
	if attrs["action"] == "cancel" {
		return h.cancel(ctx, attrs["runId"], "message "+m.Message.MessageID)
	}
	// The caller's runId is its idempotency key; read it leniently, so even
	// a spec that is otherwise invalid keeps the ID its caller chose.
	var peek struct {
		RunID string `json:"runId"`
	}
	_ = json.Unmarshal(m.Message.Data, &peek)
	runID := peek.RunID
	if spec.CheckRunID(runID) != "" {
		runID = names.RunIDFromMessage(pipeline.TopicOf(e), m.Message.MessageID)
	}
	source := fmt.Sprintf("pubsub:%s#%s", pipeline.TopicOf(e), m.Message.MessageID)
	return h.intake(ctx, runID, source, "request", m.Message.Data, int64(len(m.Message.Data)))
}

// newRecord is the record of a new run: ACCEPTED with its parsed spec, or
// REJECTED with every problem of its spec, including what the deployment
// does not let runs use (deploymentProblems).
func newRecord(runID, source, defaultName string, data []byte, size int64, cfg config.Config, now time.Time) *runs.Record {
	var s *spec.JobSpec
	var err error
	if data == nil && size > spec.MaxBytes {
		err = spec.Problems{{Path: "$", Message: fmt.Sprintf("spec is %d bytes (at most %d)", size, spec.MaxBytes)}}
	} else {
		s, err = spec.Parse(data)
	}
	if err == nil {
		err = deploymentProblems(s, cfg)
	}
	var ps spec.Problems
	if err != nil && !errors.As(err, &ps) {
		ps = spec.Problems{{Path: "$", Message: err.Error()}}
	}
	if err != nil {
		s = nil
	}
	rec := runs.NewRecord(runID, source, defaultName, s, ps, now)
	rec.UseImages(cfg.TrainerImage)
	return rec
}

// deploymentProblems are the places a valid spec names that the deployment
// gives its functions no access to: a checkpoint bucket they may not read
// (its workers would stay up), a data bucket the Ray pods may not read (the
// run would fail once its GPUs were up), a namespace where they have no
// Kubernetes permissions (every step would be refused).
func deploymentProblems(s *spec.JobSpec, cfg config.Config) error {
	var ps spec.Problems
	if !cfg.MayWrite(s.Output.Bucket) {
		ps = append(ps, spec.Problem{Path: "output.bucket", Message: fmt.Sprintf("%q is not a checkpoint bucket of this deployment; runs may write to %s", s.Output.Bucket, strings.Join(cfg.OutputBuckets, ", "))})
	}
	if src := s.Dataset.Source; src != "" {
		bucket, _, _ := strings.Cut(strings.TrimPrefix(src, "gs://"), "/")
		if !cfg.MayRead(bucket) {
			allowed := "none: this deployment names no data bucket (RAYDROP_DATA_BUCKETS, the HCL's data_buckets)"
			if len(cfg.DataBuckets) > 0 {
				allowed = strings.Join(cfg.DataBuckets, ", ")
			}
			ps = append(ps, spec.Problem{Path: "dataset.source", Message: fmt.Sprintf("bucket %q is not a data bucket of this deployment; runs may read data from %s", bucket, allowed)})
		}
	}
	if !cfg.MayUse(s.Cluster.Namespace) {
		ps = append(ps, spec.Problem{Path: "cluster.namespace", Message: fmt.Sprintf("%q is not a namespace of this deployment; runs may use %s", s.Cluster.Namespace, strings.Join(cfg.Namespaces, ", "))})
	}
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// cancel records a cancellation request and asks the monitor to act on it
// now; the sweep acts on it otherwise.
func (h *Handler) cancel(ctx context.Context, runID, from string) error {
	d := h.Deps
	if spec.CheckRunID(runID) != "" {
		return pipeline.Permanent(fmt.Errorf("cancellation from %s names no valid run id (%q)", from, runID))
	}
	rec, err := d.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		// Not a run: a sweep's ID cancels every trial of the sweep.
		switch err := d.CancelSweep(ctx, runID, from); {
		case errors.Is(err, sweeps.ErrNotFound):
			return pipeline.Permanent(fmt.Errorf("cancellation from %s: no run or sweep %s", from, runID))
		default:
			return err
		}
	}
	if err != nil {
		return err
	}
	if rec.Phase.Terminal() {
		d.Log.Info("cancel_ignored", "run_id", runID, "phase", rec.Phase)
		return nil
	}
	rec, err = d.Runs.Update(ctx, runID, func(r *runs.Record) error { return r.MarkCancelRequested() })
	if err != nil {
		return err
	}
	d.Log.Info("cancel_requested", "run_id", runID, "from", from)
	return d.Send(ctx, d.Config.Topics.Submitted, pipeline.Step{RunID: runID, Attempt: rec.Attempt})
}
