// Package gcsdoc keeps small JSON documents in Cloud Storage and changes
// them by compare-and-swap on the object generation, so concurrent writers
// never lose an update, and no faster than Cloud Storage lets one object
// be written (WriteInterval).
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

// recent reports whether a document whose Last-Modified header says
// written (whole seconds, rounded down) may have been written less than
// WriteInterval ago.
func recent(written time.Time) bool {
	return !written.IsZero() && WriteInterval > 0 && time.Since(written) < WriteInterval+time.Second
}

func attrs(ctx context.Context, obj *storage.ObjectHandle) (*storage.ObjectAttrs, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	a, err := obj.Attrs(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", obj.ObjectName(), err)
	}
	return a, nil
}

// pace is how long to wait before writing a document last written at
// written (zero for a document never written), to keep WriteInterval
// between its writes; 0 to write now.
func pace(written time.Time) time.Duration {
	if written.IsZero() || WriteInterval <= 0 {
		return 0
	}
	// At most one interval: a server clock ahead of ours waits no longer.
	wait := min(WriteInterval-time.Since(written), WriteInterval)
	if wait <= 0 {
		return 0
	}
	return wait + rand.N(paceJitter)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff waits before try i+1 (i from 0), or until ctx ends.
func backoff(ctx context.Context, i int) error {
	bound := min(firstBackoff<<i, maxBackoff)
	return sleep(ctx, rand.N(bound)+time.Millisecond)
}

// WriteInterval is the least time Update leaves between two writes of one
// document. Cloud Storage allows about one write per second to one object
// name and answers faster writes with 429 ("The object exceeded the rate
// limit for object mutation operations"):
// https://cloud.google.com/storage/quotas#objects and
// https://cloud.google.com/storage/docs/gcs429. A step that writes a record
// its previous step wrote a moment ago waits for the rest of the second
// rather than being refused. Tests of pure logic on an in-process server
// that enforces no limit may set it to 0.
var WriteInterval = time.Second

// paceJitter spreads the writers that wait for one document over a moment,
// so that one of them writes and the others see its write when they read
// again, instead of all writing at once.
const paceJitter = 150 * time.Millisecond

// CallTimeout bounds each Cloud Storage request, well inside the functions'
// timeout, so a request that hangs fails (and is retried) instead of
// holding the delivery.
const CallTimeout = 30 * time.Second

// Read decodes the document into v and returns its generation.
func Read(ctx context.Context, obj *storage.ObjectHandle, v any) (int64, error) {
	gen, _, err := read(ctx, obj, v)
	return gen, err
}

// read is Read, with the time the document was last written.
func read(ctx context.Context, obj *storage.ObjectHandle, v any) (int64, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	rd, err := obj.NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return 0, time.Time{}, ErrNotFound
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("read %s: %w", obj.ObjectName(), err)
	}
	defer func() { _ = rd.Close() }() // read-only: nothing to lose
	b, err := io.ReadAll(io.LimitReader(rd, maxDoc))
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("read %s: %w", obj.ObjectName(), err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return 0, time.Time{}, fmt.Errorf("decode %s: %w", obj.ObjectName(), err)
	}
	return rd.Attrs.Generation, rd.Attrs.LastModified, nil
}

// Write stores v under cond (DoesNotExist or GenerationMatch) with the given
// custom metadata. A failed precondition is reported by IsPrecondition.
// A write Cloud Storage refuses for the object's write rate (429) is sent
// again after WriteInterval, a few times: the precondition makes it safe
// to repeat (the single-request upload below gets no retries from the
// client library).
func Write(ctx context.Context, obj *storage.ObjectHandle, v any, cond storage.Conditions, metadata map[string]string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", obj.ObjectName(), err)
	}
	return resendRateLimited(ctx, func() error { return write(ctx, obj, b, cond, metadata) })
}

// resendRateLimited calls send until Cloud Storage stops refusing it for
// the object's write rate (429), WriteInterval apart, a few times at most.
func resendRateLimited(ctx context.Context, send func() error) error {
	for i := 0; ; i++ {
		err := send()
		if !IsRateLimited(err) || i == rateLimitedTries-1 {
			return err
		}
		if err := sleep(ctx, WriteInterval+rand.N(paceJitter)); err != nil {
			return err
		}
	}
}

// rateLimitedTries is how often Write sends a write refused with 429.
const rateLimitedTries = 5

// IsRateLimited reports whether err is Cloud Storage's 429.
func IsRateLimited(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusTooManyRequests
}

func write(ctx context.Context, obj *storage.ObjectHandle, b []byte, cond storage.Conditions, metadata map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
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

// Delete deletes the document; one that does not exist is no error. A
// delete refused for the object's write rate (429) is sent again, as in
// Write.
func Delete(ctx context.Context, obj *storage.ObjectHandle) error {
	err := resendRateLimited(ctx, func() error {
		cctx, cancel := context.WithTimeout(ctx, CallTimeout)
		defer cancel()
		return obj.Delete(cctx)
	})
	if err == nil || errors.Is(err, storage.ErrObjectNotExist) {
		return nil
	}
	return fmt.Errorf("delete %s: %w", obj.ObjectName(), err)
}

// IsPrecondition reports whether err is Cloud Storage's 412.
func IsPrecondition(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
}

// Update reads the document (a zero T when it does not exist), applies fn
// and writes it back only if nobody changed it meanwhile, retrying on a lost
// race. fn may run several times. meta gives the custom metadata to store.
// A document written less than WriteInterval ago is written when the
// interval has passed, after reading it again.
func Update[T any](ctx context.Context, obj *storage.ObjectHandle, fn func(doc *T, exists bool) error, meta func(*T) map[string]string) (*T, error) {
	lost := 0
	// The exact update time of the generation last asked for, so a read
	// again after waiting does not ask again.
	var knownGen int64
	var knownTime time.Time
	for lost < tries {
		var doc T
		gen, written, err := read(ctx, obj, &doc)
		exists := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err := fn(&doc, exists); errors.Is(err, ErrNoChange) {
			return &doc, nil
		} else if err != nil {
			return nil, err
		}
		switch {
		case recent(written) && gen == knownGen:
			written = knownTime
		case recent(written):
			// The read's Last-Modified has whole seconds only: ask for the
			// object's exact update time.
			a, err := attrs(ctx, obj)
			if errors.Is(err, storage.ErrObjectNotExist) {
				continue // deleted meanwhile: read it again
			}
			if err != nil {
				return nil, err
			}
			if a.Generation != gen {
				continue // written meanwhile: read it again
			}
			written, knownGen, knownTime = a.Updated, gen, a.Updated
		}
		if wait := pace(written); wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
			continue // read again: another writer may have written meanwhile
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
			lost++
			if err := backoff(ctx, lost-1); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return &doc, nil
	}
	return nil, fmt.Errorf("update %s: %w", obj.ObjectName(), ErrConflict)
}
