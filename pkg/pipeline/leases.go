package pipeline

import (
	"context"
	"errors"
	"slices"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Lease says which run holds a RayCluster and which runs wait for it, in
// order. It lives at clusters/<namespace>/<name>.json in the state bucket
// and changes only by compare-and-swap, so two runs admitted at once can
// never both hold the cluster.
type Lease struct {
	Holder  string    `json:"holder,omitempty"`
	Queue   []string  `json:"queue,omitempty"`
	Updated time.Time `json:"updated"`
}

// LeaseStore keeps cluster leases (Leases in production).
type LeaseStore interface {
	// Acquire makes runID the holder when the cluster is free (or already
	// held by runID); otherwise it queues runID once. It returns the lease.
	Acquire(ctx context.Context, namespace, cluster, runID string) (*Lease, error)
	// Release takes runID off the lease: a holder hands the cluster to the
	// first queued run, whose ID it returns as next ("" when none waits, or
	// when runID did not hold the cluster); a queued run leaves the queue.
	Release(ctx context.Context, namespace, cluster, runID string) (lease *Lease, next string, err error)
	// Get reads a lease; a cluster nobody has leased has an empty one.
	Get(ctx context.Context, namespace, cluster string) (*Lease, error)
}

// Leases keeps cluster leases in a Cloud Storage bucket.
type Leases struct {
	Bucket *storage.BucketHandle
	Clock  runs.Clock
}

func (l *Leases) object(namespace, cluster string) *storage.ObjectHandle {
	return l.Bucket.Object("clusters/" + namespace + "/" + cluster + ".json")
}

// Acquire implements LeaseStore.
func (l *Leases) Acquire(ctx context.Context, namespace, cluster, runID string) (*Lease, error) {
	return gcsdoc.Update(ctx, l.object(namespace, cluster), func(le *Lease, _ bool) error {
		switch {
		case le.Holder == runID || slices.Contains(le.Queue, runID) && le.Holder != "":
			return gcsdoc.ErrNoChange
		case le.Holder == "":
			le.Holder = runID
			le.Queue = slices.DeleteFunc(le.Queue, func(s string) bool { return s == runID })
		default:
			le.Queue = append(le.Queue, runID)
		}
		le.Updated = l.Clock.Now()
		return nil
	}, nil)
}

// Release implements LeaseStore.
func (l *Leases) Release(ctx context.Context, namespace, cluster, runID string) (lease *Lease, next string, err error) {
	lease, err = gcsdoc.Update(ctx, l.object(namespace, cluster), func(le *Lease, exists bool) error {
		next = ""
		switch {
		case !exists:
			return gcsdoc.ErrNoChange
		case le.Holder == runID:
			le.Holder = ""
			if len(le.Queue) > 0 {
				le.Holder, le.Queue = le.Queue[0], le.Queue[1:]
				next = le.Holder
			}
		case slices.Contains(le.Queue, runID):
			le.Queue = slices.DeleteFunc(le.Queue, func(s string) bool { return s == runID })
		default:
			return gcsdoc.ErrNoChange
		}
		le.Updated = l.Clock.Now()
		return nil
	}, nil)
	return lease, next, err
}

// Get implements LeaseStore.
func (l *Leases) Get(ctx context.Context, namespace, cluster string) (*Lease, error) {
	var le Lease
	if _, err := gcsdoc.Read(ctx, l.object(namespace, cluster), &le); err != nil && !errors.Is(err, gcsdoc.ErrNotFound) {
		return nil, err
	}
	return &le, nil
}
