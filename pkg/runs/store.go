package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
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
	maxRecord  = 4 << 20
	casTries   = 16
	// Custom metadata kept on each record object, so one listing gives the
	// phase of every run without reading each record.
	metaPhase   = "raydrop-phase"
	metaCluster = "raydrop-cluster"
)

// ObjectName is the name of a run's record.
func ObjectName(runID string) string { return Prefix + runID + "/" + StatusFile }

// Store keeps run records in a Cloud Storage bucket.
type Store struct {
	Bucket *storage.BucketHandle
	Now    func() time.Time
}

// Summary is what a listing tells about a run without reading its record.
type Summary struct {
	RunID   string
	Phase   Phase
	Cluster string
	Updated time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Create writes a new record; ErrExists if the run already has one.
func (s *Store) Create(ctx context.Context, r *Record) error {
	t := s.now()
	r.CreatedAt, r.UpdatedAt = t, t
	err := s.write(ctx, r, storage.Conditions{DoesNotExist: true})
	if isPrecondition(err) {
		return ErrExists
	}
	return err
}

// Get reads a record.
func (s *Store) Get(ctx context.Context, runID string) (*Record, error) {
	r, _, err := s.read(ctx, runID)
	return r, err
}

// Update applies fn to the current record and writes it back if nothing
// changed it meanwhile, re-reading and re-applying on a lost race. fn may be
// called several times and must depend only on the record it is given. It
// returns the record as stored; with ErrNoChange from fn, the record as read.
func (s *Store) Update(ctx context.Context, runID string, fn func(*Record) error) (*Record, error) {
	for range casTries {
		r, gen, err := s.read(ctx, runID)
		if err != nil {
			return nil, err
		}
		if err := fn(r); errors.Is(err, ErrNoChange) {
			return r, nil
		} else if err != nil {
			return nil, err
		}
		r.UpdatedAt = s.now()
		err = s.write(ctx, r, storage.Conditions{GenerationMatch: gen})
		if isPrecondition(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("update run %s: %w", runID, ErrConflict)
}

// List summarises every run with one paginated listing of the record prefix.
func (s *Store) List(ctx context.Context) ([]Summary, error) {
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
		out = append(out, Summary{RunID: id, Phase: Phase(a.Metadata[metaPhase]), Cluster: a.Metadata[metaCluster], Updated: a.Updated})
	}
}

func (s *Store) read(ctx context.Context, runID string) (*Record, int64, error) {
	rd, err := s.Bucket.Object(ObjectName(runID)).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, 0, fmt.Errorf("run %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read run %s: %w", runID, err)
	}
	defer func() { _ = rd.Close() }() // read-only: nothing to lose
	b, err := io.ReadAll(io.LimitReader(rd, maxRecord))
	if err != nil {
		return nil, 0, fmt.Errorf("read run %s: %w", runID, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, 0, fmt.Errorf("decode run %s: %w", runID, err)
	}
	return &r, rd.Attrs.Generation, nil
}

func (s *Store) write(ctx context.Context, r *Record, cond storage.Conditions) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode run %s: %w", r.RunID, err)
	}
	w := s.Bucket.Object(ObjectName(r.RunID)).If(cond).NewWriter(ctx)
	w.ContentType = "application/json"
	w.Metadata = map[string]string{metaPhase: string(r.Phase), metaCluster: r.Cluster}
	// One request: the record is small, and a single multipart upload
	// carries the precondition.
	w.ChunkSize = 0
	if _, err := w.Write(b); err != nil {
		_ = w.Close()
		return fmt.Errorf("write run %s: %w", r.RunID, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write run %s: %w", r.RunID, err)
	}
	return nil
}

func isPrecondition(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
}
