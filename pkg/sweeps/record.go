// Package sweeps holds a sweep's record, sweeps/<id>/status.json in the
// state bucket: the sweep's spec, its trials (each a run of its own, with a
// run ID derived from the sweep's) and what each found, and the sweep's
// phase. Like a run record it is created once (DoesNotExist) and advanced
// only by compare-and-swap, so a sweep dropped twice is one sweep and a
// crash anywhere in its fan-out starts each trial once. The decisions that
// drive a sweep (which trials start, when it ends, which trial is best,
// whether the median rule stops one) are pure functions here (plan.go).
package sweeps

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Phase is where a sweep is.
type Phase string

// The phases: a sweep runs until every trial it started has ended and no
// other will start, then ends succeeded (a trial left a checkpoint),
// failed (none did) or cancelled (a user asked).
const (
	Running   Phase = "RUNNING"
	Succeeded Phase = "SUCCEEDED"
	Failed    Phase = "FAILED"
	Cancelled Phase = "CANCELLED"
)

// Terminal reports whether the sweep has ended.
func (p Phase) Terminal() bool { return p == Succeeded || p == Failed || p == Cancelled }

// Event is the name of the phase's public event (dev.raydrop.sweep.v1.<event>),
// "" for a phase that has none.
func (p Phase) Event() string {
	if p.Terminal() {
		return strings.ToLower(string(p))
	}
	return ""
}

// Record is a sweep's status document.
type Record struct {
	APIVersion string        `json:"apiVersion"`
	SweepID    string        `json:"sweepId"`
	Name       string        `json:"name"`
	Source     string        `json:"source"`
	SpecHash   string        `json:"specHash"`
	Spec       *spec.JobSpec `json:"spec"`
	Phase      Phase         `json:"phase"`
	// Reason and Message say why the sweep ended as it did.
	Reason          string  `json:"reason,omitempty"`
	Message         string  `json:"message,omitempty"`
	CancelRequested bool    `json:"cancelRequested,omitempty"`
	Trials          []Trial `json:"trials"`
	// Best is the index of the trial with the lowest held-out loss, once
	// the sweep has ended with one.
	Best int `json:"best,omitempty"`
	// Report is the gs:// URI of the sweep's report page, once written.
	Report string `json:"report,omitempty"`
	// Published: the terminal event has gone out. Publishing: when a
	// delivery claimed the right to publish it (a stale claim lets another
	// delivery try).
	Published  bool       `json:"published,omitempty"`
	Publishing *time.Time `json:"publishing,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	EndedAt    *time.Time `json:"endedAt,omitempty"`
}

// Trial is one run of the sweep.
type Trial struct {
	Index   int               `json:"index"`
	RunID   string            `json:"runId"`
	Params  []spec.ParamValue `json:"params"`
	Cluster string            `json:"cluster,omitempty"` // set when it starts
	// StartedAt is when the sweep started it: its run record is created
	// from then on (by the delivery that started it, or, if that one died,
	// by the next one that advances the sweep).
	StartedAt *time.Time `json:"startedAt,omitempty"`
	// Ended is the trial run's terminal phase, once noted.
	Ended   runs.Phase  `json:"ended,omitempty"`
	Reason  runs.Reason `json:"reason,omitempty"`
	EndedAt *time.Time  `json:"endedAt,omitempty"`
	// Cause and Summary name why a trial that ended other than succeeded
	// did (its run's cause).
	Cause   string `json:"cause,omitempty"`
	Summary string `json:"summary,omitempty"`
	// EvalLosses is the held-out loss at each of its checkpoints, in order,
	// as far as they are known (noted while it runs, completed when it
	// ends).
	EvalLosses []float64 `json:"evalLosses,omitempty"`
	// EvalSteps is the step of each of those checkpoints.
	EvalSteps []int64 `json:"evalSteps,omitempty"`
	// BestEvalLoss and BestCheckpoint are its best checkpoint by held-out
	// loss, once it has ended with one.
	BestEvalLoss   *float64 `json:"bestEvalLoss,omitempty"`
	BestCheckpoint string   `json:"bestCheckpoint,omitempty"`
	Steps          int64    `json:"steps,omitempty"`
	GPUHours       float64  `json:"gpuHours,omitempty"`
	CostUSD        float64  `json:"costUsd,omitempty"`
}

// Started reports whether the sweep started the trial.
func (t Trial) Started() bool { return t.StartedAt != nil }

// Active reports whether the trial was started and has not been noted
// ended.
func (t Trial) Active() bool { return t.Started() && t.Ended == "" }

// TrialRunID is the run ID of a sweep's trial index: the sweep's ID and
// the trial's number, within a run ID's 40 characters (a long sweep ID,
// a caller's runId, is cut and keeps a hash of the whole).
func TrialRunID(sweepID string, index int) string {
	const room = 40 - len("-t000")
	base := sweepID
	if len(base) > room {
		base = base[:room-13] + "-" + shortHash(sweepID)
	}
	return fmt.Sprintf("%s-t%03d", base, index)
}

// NewRecord is a new sweep's record: RUNNING with every trial expanded
// from its spec, none started.
func NewRecord(sweepID, source, name, specHash string, s *spec.JobSpec, now time.Time) (*Record, error) {
	trials, err := s.Trials()
	if err != nil {
		return nil, err
	}
	r := &Record{APIVersion: spec.APIVersion, SweepID: sweepID, Name: name, Source: source, SpecHash: specHash, Spec: s,
		Phase: Running, CreatedAt: now, UpdatedAt: now}
	for _, t := range trials {
		r.Trials = append(r.Trials, Trial{Index: t.Index, RunID: TrialRunID(sweepID, t.Index), Params: t.Params})
	}
	return r, nil
}

// Trial returns the trial whose run is runID, or nil.
func (r *Record) Trial(runID string) *Trial {
	for i := range r.Trials {
		if r.Trials[i].RunID == runID {
			return &r.Trials[i]
		}
	}
	return nil
}

// Errors of the store.
var (
	ErrNotFound = errors.New("sweep record not found")
	ErrExists   = errors.New("sweep record already exists")
	// ErrNoChange returned by an update function leaves the record as is.
	ErrNoChange = errors.New("no change")
)

const (
	// Prefix holds every sweep record: Prefix + <sweep ID> + "/" + StatusFile.
	Prefix     = "sweeps/"
	StatusFile = "status.json"
	metaPhase  = "raydrop-phase"
	metaSettle = "raydrop-unannounced"
)

// ObjectName is the name of a sweep's record.
func ObjectName(sweepID string) string { return Prefix + sweepID + "/" + StatusFile }

// Store keeps sweep records in a Cloud Storage bucket.
type Store struct {
	Bucket *storage.BucketHandle
	Clock  runs.Clock
}

// Create writes a new record; ErrExists if the sweep already has one.
func (s *Store) Create(ctx context.Context, r *Record) error {
	t := s.Clock.Now()
	r.CreatedAt, r.UpdatedAt = t, t
	err := gcsdoc.Write(ctx, s.object(r.SweepID), r, storage.Conditions{DoesNotExist: true}, meta(r))
	if gcsdoc.IsPrecondition(err) {
		return fmt.Errorf("sweep %s: %w", r.SweepID, ErrExists)
	}
	return err
}

// Get reads a record.
func (s *Store) Get(ctx context.Context, sweepID string) (*Record, error) {
	var r Record
	if _, err := gcsdoc.Read(ctx, s.object(sweepID), &r); errors.Is(err, gcsdoc.ErrNotFound) {
		return nil, fmt.Errorf("sweep %s: %w", sweepID, ErrNotFound)
	} else if err != nil {
		return nil, err
	}
	return &r, nil
}

// Update applies fn to the current record and writes it back if nothing
// changed it meanwhile, re-reading and re-applying on a lost race; fn may
// run several times. With ErrNoChange from fn it returns the record as read.
func (s *Store) Update(ctx context.Context, sweepID string, fn func(*Record) error) (*Record, error) {
	return gcsdoc.Update(ctx, s.object(sweepID), func(r *Record, exists bool) error {
		if !exists {
			return fmt.Errorf("sweep %s: %w", sweepID, ErrNotFound)
		}
		if err := fn(r); err != nil {
			if errors.Is(err, ErrNoChange) {
				return gcsdoc.ErrNoChange
			}
			return err
		}
		r.UpdatedAt = s.Clock.Now()
		return nil
	}, meta)
}

// Summary is what a listing tells about a sweep without reading its
// record.
type Summary struct {
	SweepID string
	Phase   Phase
	// Unannounced: the sweep has ended but its event has not gone out.
	Unannounced bool
	Updated     time.Time
}

// List summarises every sweep with one listing of the record prefix.
func (s *Store) List(ctx context.Context) ([]Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*gcsdoc.CallTimeout)
	defer cancel()
	it := s.Bucket.Objects(ctx, &storage.Query{Prefix: Prefix})
	var out []Summary
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list sweep records: %w", err)
		}
		id, file, ok := strings.Cut(strings.TrimPrefix(a.Name, Prefix), "/")
		if !ok || file != StatusFile {
			continue
		}
		out = append(out, Summary{SweepID: id, Phase: Phase(a.Metadata[metaPhase]), Unannounced: a.Metadata[metaSettle] == "true", Updated: a.Updated})
	}
}

func (s *Store) object(sweepID string) *storage.ObjectHandle {
	return s.Bucket.Object(ObjectName(sweepID))
}

func meta(r *Record) map[string]string {
	m := map[string]string{metaPhase: string(r.Phase)}
	if r.Phase.Terminal() && !r.Published {
		m[metaSettle] = "true"
	}
	return m
}
