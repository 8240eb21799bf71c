package runs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
)

// Errors of the store.
var (
	ErrNotFound = errors.New("run record not found")
	ErrExists   = errors.New("run record already exists")
	// ErrNoChange returned by an update function leaves the record as is.
	ErrNoChange = errors.New("no change")
	// ErrConflict means the compare-and-swap kept losing; the caller should
	// be retried later (a transient error).
	ErrConflict = errors.New("run record kept changing under the update")
)

const (
	// Prefix holds every run record: Prefix + <run ID> + "/" + StatusFile.
	Prefix     = "runs/"
	StatusFile = "status.json"
	// Custom metadata kept on each record object, so one listing gives the
	// phase of every run without reading each record.
	metaPhase       = "raydrop-phase"
	metaCluster     = "raydrop-cluster"
	metaUnannounced = "raydrop-unannounced"
	metaCancel      = "raydrop-cancel-requested"
	metaUpdated     = "raydrop-updated-at"
)

// ObjectName is the name of a run's record.
func ObjectName(runID string) string { return Prefix + runID + "/" + StatusFile }

// Clock tells the time; nil is the system clock. The pipeline passes one
// clock to everything that stamps times, so tests move them all at once.
type Clock func() time.Time

// Now is the current time in UTC.
func (c Clock) Now() time.Time {
	if c != nil {
		return c().UTC()
	}
	return time.Now().UTC()
}

// Store keeps run records in a Cloud Storage bucket.
type Store struct {
	Bucket *storage.BucketHandle
	Clock  Clock
}

// Summary is what a listing tells about a run without reading its record.
type Summary struct {
	RunID   string
	Phase   Phase
	Cluster string // namespace/name
	Updated time.Time
	// UpdatedAt is the record's own updatedAt; zero for a record written
	// before the metadata carried it.
	UpdatedAt time.Time
	// Unannounced: the run has ended but its terminal event has not gone
	// out (Record.Unannounced).
	Unannounced bool
	// CancelRequested: the run's cancellation is requested.
	CancelRequested bool
}

// Create writes a new record; ErrExists if the run already has one.
func (s *Store) Create(ctx context.Context, r *Record) error {
	t := s.Clock.Now()
	r.CreatedAt, r.UpdatedAt = t, t
	err := gcsdoc.Write(ctx, s.object(r.RunID), r, storage.Conditions{DoesNotExist: true}, meta(r))
	if gcsdoc.IsPrecondition(err) {
		return fmt.Errorf("run %s: %w", r.RunID, ErrExists)
	}
	return err
}

// Get reads a record.
func (s *Store) Get(ctx context.Context, runID string) (*Record, error) {
	var r Record
	if _, err := gcsdoc.Read(ctx, s.object(runID), &r); errors.Is(err, gcsdoc.ErrNotFound) {
		return nil, fmt.Errorf("run %s: %w", runID, ErrNotFound)
	} else if err != nil {
		return nil, err
	}
	return &r, nil
}

// Update applies fn to the current record and writes it back if nothing
// changed it meanwhile, re-reading and re-applying on a lost race. fn may be
// called several times and must depend only on the record it is given. It
// returns the record as stored; with ErrNoChange from fn, the record as read.
func (s *Store) Update(ctx context.Context, runID string, fn func(*Record) error) (*Record, error) {
	r, err := gcsdoc.Update(ctx, s.object(runID), func(r *Record, exists bool) error {
		if !exists {
			return fmt.Errorf("run %s: %w", runID, ErrNotFound)
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
	if errors.Is(err, gcsdoc.ErrConflict) {
		return nil, fmt.Errorf("update run %s: %w", runID, ErrConflict)
	}
	return r, err
}

// List summarises every run with one paginated listing of the record prefix.
func (s *Store) List(ctx context.Context) ([]Summary, error) {
	// One page at a time; the whole listing gets a few calls' time.
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
			return nil, fmt.Errorf("list run records: %w", err)
		}
		id, file, ok := strings.Cut(strings.TrimPrefix(a.Name, Prefix), "/")
		if !ok || file != StatusFile {
			continue
		}
		updatedAt, _ := time.Parse(time.RFC3339Nano, a.Metadata[metaUpdated])
		out = append(out, Summary{RunID: id, Phase: Phase(a.Metadata[metaPhase]), Cluster: a.Metadata[metaCluster], Updated: a.Updated, UpdatedAt: updatedAt,
			Unannounced: a.Metadata[metaUnannounced] == "true", CancelRequested: a.Metadata[metaCancel] == "true"})
	}
}

func (s *Store) object(runID string) *storage.ObjectHandle { return s.Bucket.Object(ObjectName(runID)) }

func meta(r *Record) map[string]string {
	cluster := ""
	if r.Cluster != "" {
		cluster = r.Namespace + "/" + r.Cluster
	}
	m := map[string]string{metaPhase: string(r.Phase), metaCluster: cluster, metaUpdated: r.UpdatedAt.Format(time.RFC3339Nano)}
	if r.Unannounced() {
		m[metaUnannounced] = "true"
	}
	if r.CancelRequested {
		m[metaCancel] = "true"
	}
	return m
}
