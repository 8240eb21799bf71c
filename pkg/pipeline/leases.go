package pipeline

import (
	"context"
	"errors"
	"slices"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
)

// Lease says which run holds a RayCluster and which runs wait for it, in
// order. It lives at clusters/<namespace>/<name>.json in the intake bucket
// and changes only by compare-and-swap, so two runs admitted at once can
// never both hold the cluster.
type Lease struct {
	Holder  string    `json:"holder,omitempty"`
	Queue   []string  `json:"queue,omitempty"`
	Updated time.Time `json:"updated"`
}

// Leases keeps cluster leases.
type Leases struct {
	Bucket *storage.BucketHandle
	Now    func() time.Time
}

func (l *Leases) object(namespace, cluster string) *storage.ObjectHandle {
	return l.Bucket.Object("clusters/" + namespace + "/" + cluster + ".json")
}

func (l *Leases) now() time.Time {
	if l.Now != nil {
		return l.Now().UTC()
	}
	return time.Now().UTC()
}

// Acquire makes runID the holder when the cluster is free (or already
// held by runID); otherwise it queues runID once. It returns the lease.
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
		le.Updated = l.now()
		return nil
	}, nil)
}

// Release takes runID off the lease: a holder hands the cluster to the first
// queued run, whose ID it returns as next ("" when none waits, or when runID
// did not hold the cluster); a queued run leaves the queue.
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
		le.Updated = l.now()
		return nil
	}, nil)
	return lease, next, err
}

// Get reads a lease; a cluster nobody has leased has an empty one.
func (l *Leases) Get(ctx context.Context, namespace, cluster string) (*Lease, error) {
	var le Lease
	if _, err := gcsdoc.Read(ctx, l.object(namespace, cluster), &le); err != nil && !errors.Is(err, gcsdoc.ErrNotFound) {
		return nil, err
	}
	return &le, nil
}
