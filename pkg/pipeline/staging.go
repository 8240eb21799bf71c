package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/weights"
)

// StagingLease says which run stages a model revision into the
// deployment's bucket: staging/<repo>/<commit>.json in the state bucket,
// changed only by compare-and-swap, so that of several runs submitted at
// once exactly one copies the snapshot and the others wait for its marker.
type StagingLease struct {
	Holder string    `json:"holder"`
	Since  time.Time `json:"since"`
}

// stagingLeaseName is the lease of a staged folder: named after the whole
// folder, so a new staging root gets leases of its own.
func stagingLeaseName(loc weights.Location) string {
	return "staging/" + loc.Bucket + "/" + loc.Prefix + ".json"
}

// markerLimit bounds the staged marker read (a file list).
const markerLimit = 4 << 20

// StageModel is where the current attempt of rec reads its base model,
// and whether it is the one that stages it, when the deployment stages
// models (nil otherwise):
//   - the commit is the one the first attempt pinned, or the Hub's answer
//     for the spec's revision (an error weights.IsPermanent recognises
//     when the Hub has no such revision or refuses the token);
//   - a revision whose marker is in the bucket is staged: the run reads it;
//   - otherwise the run takes the staging lease, unless a run that has not
//     ended holds it: the holder copies, the others wait for its marker.
//
// A holder that ended without a marker (its copy failed, or it was
// cancelled) leaves the lease to the next run that asks.
func (d *Deps) StageModel(ctx context.Context, rec *runs.Record) (*runs.Model, error) {
	root := d.Config.ModelStaging
	if root == "" || rec.Spec == nil {
		return nil, nil
	}
	m := &runs.Model{Repo: rec.Spec.Model.ID, Revision: rec.Spec.Model.Revision}
	if m.Revision == "" {
		m.Revision = "main"
	}
	// A commit pinned by an earlier attempt, or asked for by the spec, is
	// looked for in the bucket first: a staged one needs nothing of the Hub.
	hub := weights.Hub{Endpoint: d.Config.HubEndpoint, Token: d.Config.HubToken}
	pinned := rec.Model != nil && rec.Model.Commit != ""
	named := weights.CommitRe.MatchString(m.Revision) // the spec names a commit
	switch {
	case pinned:
		m.Commit = rec.Model.Commit
	case named:
		m.Commit = m.Revision
	default:
		rev, err := hub.Resolve(ctx, m.Repo, rec.Spec.Model.Revision)
		if err != nil {
			return nil, err
		}
		m.Commit = rev.Commit
	}
	loc, err := weights.At(root, m.Repo, m.Commit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", "RAYDROP_MODEL_STAGING", err)
	}
	m.URI = loc.URI()
	if staged, by, err := d.stagedBy(ctx, loc); err != nil || staged {
		m.StagedBy, m.Staged = by, staged
		return m, err
	}
	if !pinned {
		// A commit the spec named is checked, as a branch was resolved. And
		// whoever stages must be able to read the files: a gated model whose
		// terms the token's account has not accepted lists fine, and refuses
		// its files. A commit pinned by an earlier attempt was checked then.
		if named {
			if _, err := hub.Resolve(ctx, m.Repo, m.Commit); err != nil {
				return nil, err
			}
		}
		if err := hub.CanRead(ctx, m.Repo, m.Commit, "config.json"); err != nil {
			return nil, err
		}
	}
	lease, err := gcsdoc.Update(ctx, d.StateBucket.Object(stagingLeaseName(loc)), func(l *StagingLease, _ bool) error {
		if l.Holder == rec.RunID {
			return gcsdoc.ErrNoChange
		}
		if l.Holder != "" {
			ended, err := d.ended(ctx, l.Holder)
			if err != nil {
				return err
			}
			if !ended {
				return gcsdoc.ErrNoChange
			}
			d.Log.Info("staging_taken_over", "run_id", rec.RunID, "from", l.Holder, "model", m.Repo, "commit", m.Commit)
		}
		l.Holder, l.Since = rec.RunID, d.Time()
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("staging lease of %s@%s: %w", m.Repo, m.Commit, err)
	}
	m.StagedBy = lease.Holder
	return m, nil
}

// stagedBy reads the staged folder's marker: whether it is there, and the
// run that staged it.
func (d *Deps) stagedBy(ctx context.Context, loc weights.Location) (bool, string, error) {
	b, _, err := d.Objects.Read(ctx, loc.Bucket, loc.Object(weights.MarkerName), markerLimit)
	if errors.Is(err, checkpoints.ErrNotFound) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("looking for the staged model %s: %w", loc.URI(), err)
	}
	var mk weights.Marker
	if err := json.Unmarshal(b, &mk); err != nil {
		return false, "", fmt.Errorf("the staged marker %s/%s is not one: %w", loc.URI(), weights.MarkerName, err)
	}
	return true, mk.StagedBy, nil
}

// ended says whether run has ended (or has no record left).
func (d *Deps) ended(ctx context.Context, runID string) (bool, error) {
	r, err := d.Runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return r.Phase.Terminal(), nil
}
