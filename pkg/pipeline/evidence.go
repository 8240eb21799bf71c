package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// KeepEvidence keeps the evidence of one of the run's attempts
// (pkg/evidence) before its pods go, unless an earlier delivery did: it
// returns the run's evidence folder ("" for a run that had no attempt on
// a cluster). Finalize calls it before it releases the cluster; the
// monitor before it deletes a RayJob (a deadline, a cancellation, an
// early stop) and before a retry replaces the attempt. It never holds the
// teardown up for longer than the deployment's budget, and never fails
// the delivery: what it could not keep, its manifest says.
func (d *Deps) KeepEvidence(ctx context.Context, rec *runs.Record, attempt int) string {
	if rec.Spec == nil || attempt == 0 || rec.Cluster == "" {
		return ""
	}
	bucket, runFolder := manifests.Storage(rec.Spec, rec.RunID)
	folder := evidence.URI(bucket, runFolder)
	kept := evidence.AttemptFolder(runFolder, attempt)
	switch _, _, err := d.Objects.Read(ctx, bucket, kept+"/"+evidence.ManifestFile, 4<<20); {
	case err == nil:
		return folder // an earlier delivery captured it
	case !errors.Is(err, checkpoints.ErrNotFound):
		d.Log.Warn("evidence_unchecked", "run_id", rec.RunID, "error", err.Error())
	}
	t := evidence.Target{RunID: rec.RunID, Attempt: attempt, Namespace: rec.Namespace, Cluster: rec.Cluster, RayJob: names.RayJob(rec.RunID, attempt)}
	o := evidence.Options{Budget: cmp.Or(d.Config.EvidenceBudget, evidence.DefaultBudget), LogCap: cmp.Or(d.Config.EvidenceLogCap, evidence.DefaultLogCap)}
	m, err := evidence.Capture(ctx, d.Kube, objectWriter{d.Objects, bucket, kept}, t, o, d.Time)
	if err != nil {
		d.Log.Error("evidence_not_kept", "run_id", rec.RunID, "attempt", attempt, "error", err.Error())
		return ""
	}
	level, what := d.Log.Info, "evidence_kept"
	if !m.Complete {
		level, what = d.Log.Warn, "evidence_partial"
	}
	level(what, "run_id", rec.RunID, "attempt", attempt, "uri", folder, "files", len(m.Files), "missing", len(m.Missing),
		"seconds", m.FinishedAt.Sub(m.StartedAt).Seconds())
	return folder
}

// AwaitEvidence is the attempt's evidence folder to read a cause from
// when KeepEvidence kept none: two deliveries of one failure (the mark's
// notice and a tick) capture at once, and the one that loses the race for
// an object fails while the other writes the rest. It waits up to within
// for the other's manifest; the folder is returned either way, so that
// what is there (the Ray logs the pods' sidecars copied, whatever the
// capture wrote) is read rather than the trainer's mark alone. "" for a
// run that has no folder.
func (d *Deps) AwaitEvidence(ctx context.Context, rec *runs.Record, attempt int, within time.Duration) string {
	if rec.Spec == nil || attempt == 0 || rec.Cluster == "" {
		return ""
	}
	bucket, runFolder := manifests.Storage(rec.Spec, rec.RunID)
	manifest := evidence.AttemptFolder(runFolder, attempt) + "/" + evidence.ManifestFile
	for deadline := time.Now().Add(within); ; {
		if _, _, err := d.Objects.Read(ctx, bucket, manifest, 4<<20); err == nil || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return evidence.URI(bucket, runFolder)
		case <-time.After(time.Second):
		}
	}
	return evidence.URI(bucket, runFolder)
}

// objectWriter creates the evidence's objects in an attempt's folder.
type objectWriter struct {
	objects Objects
	bucket  string
	folder  string
}

func (w objectWriter) Create(ctx context.Context, name string, data []byte, contentType string) error {
	err := w.objects.Create(ctx, w.bucket, w.folder+"/"+name, data, contentType)
	if errors.Is(err, gcp.ErrExists) {
		return fmt.Errorf("%s: %w", name, evidence.ErrExists)
	}
	return err
}

// CauseInput is what names the cause of the run's current attempt
// (pkg/cause): its trainer's mark (nil if none), its last step and, when
// evidenceURI is set, what the attempt's evidence holds, read back from
// the bucket, so that every delivery names the same cause. What cannot be
// read is logged, and the cause is named from the rest.
func (d *Deps) CauseInput(ctx context.Context, rec *runs.Record, mark *checkpoints.Mark, evidenceURI string) cause.Input {
	// The reason the run ends with (recorded when it entered FINISHING)
	// says what to read: a stalled run's ranks' stacks.
	in := cause.Input{Reason: rec.Reason, Message: rec.Message}
	if mark != nil {
		in.Mark = &cause.Mark{Status: mark.Status, Error: mark.Error}
	}
	if rec.Progress != nil {
		in.Step = rec.Progress.Step
	}
	if evidenceURI == "" {
		return in
	}
	bucket, folder, err := evidence.Locate(evidenceURI, rec.Attempt)
	if err == nil {
		err = cause.Gather(ctx, d.Objects.Bucket(bucket), folder, &in)
	}
	if err != nil {
		d.Log.Warn("evidence_unread", "run_id", rec.RunID, "attempt", rec.Attempt, "error", err.Error())
	}
	return in
}
