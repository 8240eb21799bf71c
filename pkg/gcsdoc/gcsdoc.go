// Package gcsdoc keeps small JSON documents in Cloud Storage and changes
// them by compare-and-swap on the object generation, so concurrent writers
// never lose an update.
package gcsdoc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
)

// Errors.
var (
	ErrNotFound = errors.New("document not found")
	// ErrNoChange returned by an update function leaves the document as is.
	ErrNoChange = errors.New("no change")
	// ErrConflict means the compare-and-swap kept losing.
	ErrConflict = errors.New("document kept changing under the update")
)

const (
	maxDoc = 4 << 20
	tries  = 16
	// After a lost race an update waits a random time up to a doubling
	// bound (full jitter), so many writers of one document (a burst of
	// runs queueing on one cluster's lease) take turns instead of all
	// retrying at once and all losing again.
	firstBackoff = 5 * time.Millisecond
	maxBackoff   = 250 * time.Millisecond
)

// backoff waits before try i+1 (i from 0), or until ctx ends.
func backoff(ctx context.Context, i int) error {
	bound := min(firstBackoff<<i, maxBackoff)
	t := time.NewTimer(rand.N(bound) + time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CallTimeout bounds each Cloud Storage request, well inside the functions'
// timeout, so a request that hangs fails (and is retried) instead of
// holding the delivery.
const CallTimeout = 30 * time.Second

// Read decodes the document into v and returns its generation.
func Read(ctx context.Context, obj *storage.ObjectHandle, v any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	rd, err := obj.NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", obj.ObjectName(), err)
	}
	defer func() { _ = rd.Close() }() // read-only: nothing to lose
	b, err := io.ReadAll(io.LimitReader(rd, maxDoc))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", obj.ObjectName(), err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return 0, fmt.Errorf("decode %s: %w", obj.ObjectName(), err)
	}
	return rd.Attrs.Generation, nil
}

// Write stores v under cond (DoesNotExist or GenerationMatch) with the given
// custom metadata. A failed precondition is reported by IsPrecondition.
func Write(ctx context.Context, obj *storage.ObjectHandle, v any, cond storage.Conditions, metadata map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", obj.ObjectName(), err)
	}
	w := obj.If(cond).NewWriter(ctx)
	w.ContentType = "application/json"
	w.Metadata = metadata
	w.ChunkSize = 0 // one request that carries the precondition
	if _, err := w.Write(b); err != nil {
		_ = w.Close()
		return fmt.Errorf("write %s: %w", obj.ObjectName(), err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write %s: %w", obj.ObjectName(), err)
	}
	return nil
}

// IsPrecondition reports whether err is Cloud Storage's 412.
func IsPrecondition(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
}

// Update reads the document (a zero T when it does not exist), applies fn
// and writes it back only if nobody changed it meanwhile, retrying on a lost
// race. fn may run several times. meta gives the custom metadata to store.
func Update[T any](ctx context.Context, obj *storage.ObjectHandle, fn func(doc *T, exists bool) error, meta func(*T) map[string]string) (*T, error) {
	for i := range tries {
		if i > 0 {
			if err := backoff(ctx, i-1); err != nil {
				return nil, err
			}
		}
		var doc T
		gen, err := Read(ctx, obj, &doc)
		exists := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err := fn(&doc, exists); errors.Is(err, ErrNoChange) {
			return &doc, nil
		} else if err != nil {
			return nil, err
		}
		cond := storage.Conditions{DoesNotExist: true}
		if exists {
			cond = storage.Conditions{GenerationMatch: gen}
		}
		var md map[string]string
		if meta != nil {
			md = meta(&doc)
		}
		err = Write(ctx, obj, &doc, cond, md)
		if IsPrecondition(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &doc, nil
	}
	return nil, fmt.Errorf("update %s: %w", obj.ObjectName(), ErrConflict)
}
