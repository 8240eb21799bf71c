package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Lease says which run holds a RayCluster. It lives at
// clusters/<namespace>/<name>.json in the state bucket and changes only by
// compare-and-swap, so two runs admitted at once can never both hold the
// cluster.
//
// The runs that wait for the cluster are not in the lease: each has its own
// object, clusters/<namespace>/<name>/waiting/<run>.json, written once when
// it queues and deleted when it gets the cluster or leaves, and they get the
// cluster in the order their objects were created. A burst of runs queueing
// on one cluster thus writes as many objects, once each, and the lease is
// written only when the cluster changes hands: Cloud Storage allows about
// one write per second to one object (gcsdoc.WriteInterval).
type Lease struct {
	Holder string `json:"holder,omitempty"`
	// Queue is where leases written by earlier versions kept the waiting
	// runs. It is still read, and handed over to first, so that an upgraded
	// deployment loses none of them; nothing adds to it any more.
	Queue   []string  `json:"queue,omitempty"`
	Updated time.Time `json:"updated"`
}

// LeaseStore keeps cluster leases (Leases in production).
type LeaseStore interface {
	// Acquire makes runID the holder when the cluster is free (or already
	// held by runID); otherwise it queues runID once. It returns the lease.
	Acquire(ctx context.Context, namespace, cluster, runID string) (*Lease, error)
	// Release takes runID off the cluster: a holder hands the cluster to the
	// first waiting run, whose ID it returns as next ("" when none waits, or
	// when runID did not hold the cluster); a waiting run leaves the queue.
	Release(ctx context.Context, namespace, cluster, runID string) (lease *Lease, next string, err error)
	// Get reads a lease; a cluster nobody has leased has an empty one.
	Get(ctx context.Context, namespace, cluster string) (*Lease, error)
	// Held lists the leases that name a holder.
	Held(ctx context.Context) ([]HeldLease, error)
}

// HeldLease is a lease that names a holder, as Held lists it.
type HeldLease struct {
	Namespace, Cluster, Holder string
	// Updated is the lease's Updated.
	Updated time.Time
}

// The lease object's metadata repeats its holder and Updated, so that Held
// finds them with listings alone.
const (
	metaHolder  = "raydrop-holder"
	metaUpdated = "raydrop-updated"
)

func leaseMeta(le *Lease) map[string]string {
	return map[string]string{metaHolder: le.Holder, metaUpdated: le.Updated.UTC().Format(time.RFC3339Nano)}
}

// Leases keeps cluster leases in a Cloud Storage bucket.
type Leases struct {
	Bucket *storage.BucketHandle
	Clock  runs.Clock
}

func (l *Leases) object(namespace, cluster string) *storage.ObjectHandle {
	return l.Bucket.Object("clusters/" + namespace + "/" + cluster + ".json")
}

func waitingPrefix(namespace, cluster string) string {
	return "clusters/" + namespace + "/" + cluster + "/waiting/"
}

func (l *Leases) waitingObject(namespace, cluster, runID string) *storage.ObjectHandle {
	return l.Bucket.Object(waitingPrefix(namespace, cluster) + runID + ".json")
}

// waitingRecord is the content of a waiting object.
type waitingRecord struct {
	RunID string    `json:"runId"`
	Since time.Time `json:"since"`
}

// Acquire implements LeaseStore.
func (l *Leases) Acquire(ctx context.Context, namespace, cluster, runID string) (*Lease, error) {
	for {
		le, err := l.handTo(ctx, namespace, cluster, "", runID)
		if err != nil {
			return nil, err
		}
		if le.Holder == runID {
			return le, l.leave(ctx, namespace, cluster, runID)
		}
		if slices.Contains(le.Queue, runID) {
			return le, nil // waits in a lease of an earlier version
		}
		created, err := l.wait(ctx, namespace, cluster, runID)
		if err != nil || !created {
			return le, err
		}
		// The holder may have released the cluster after this run found it
		// held and before its waiting object existed, seeing nobody wait:
		// look again, so that the run is never left waiting for nobody.
		if le, err = l.Get(ctx, namespace, cluster); err != nil || le.Holder != "" {
			return le, err
		}
	}
}

// handTo makes next the holder if the cluster is held by from ("" for a
// free cluster); otherwise it changes nothing. It returns the lease.
func (l *Leases) handTo(ctx context.Context, namespace, cluster, from, next string) (*Lease, error) {
	return gcsdoc.Update(ctx, l.object(namespace, cluster), func(le *Lease, _ bool) error {
		if le.Holder != from || from == next {
			return gcsdoc.ErrNoChange
		}
		le.Holder = next
		le.Queue = slices.DeleteFunc(le.Queue, func(s string) bool { return s == next || s == from })
		le.Updated = l.Clock.Now()
		return nil
	}, leaseMeta)
}

// wait creates runID's waiting object, and reports whether this call
// created it.
func (l *Leases) wait(ctx context.Context, namespace, cluster, runID string) (bool, error) {
	err := gcsdoc.Write(ctx, l.waitingObject(namespace, cluster, runID), waitingRecord{RunID: runID, Since: l.Clock.Now()}, storage.Conditions{DoesNotExist: true}, nil)
	if gcsdoc.IsPrecondition(err) {
		return false, nil
	}
	return err == nil, err
}

// leave deletes runID's waiting object, if it has one.
func (l *Leases) leave(ctx context.Context, namespace, cluster, runID string) error {
	if err := gcsdoc.Delete(ctx, l.waitingObject(namespace, cluster, runID)); err != nil {
		return fmt.Errorf("cluster %s/%s: %w", namespace, cluster, err)
	}
	return nil
}

// Waiting lists the runs that wait for the cluster, first in line first:
// those of a lease of an earlier version, then the waiting objects in the
// order they were created.
func (l *Leases) Waiting(ctx context.Context, namespace, cluster string) ([]string, error) {
	le, err := l.Get(ctx, namespace, cluster)
	if err != nil {
		return nil, err
	}
	return l.waiting(ctx, namespace, cluster, le)
}

// waiting is Waiting, given the lease as read.
func (l *Leases) waiting(ctx context.Context, namespace, cluster string, le *Lease) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*gcsdoc.CallTimeout)
	defer cancel()
	prefix := waitingPrefix(namespace, cluster)
	it := l.Bucket.Objects(ctx, &storage.Query{Prefix: prefix})
	var objs []*storage.ObjectAttrs
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list the runs waiting for cluster %s/%s: %w", namespace, cluster, err)
		}
		if strings.HasSuffix(a.Name, ".json") {
			objs = append(objs, a)
		}
	}
	slices.SortFunc(objs, func(a, b *storage.ObjectAttrs) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Name, b.Name))
	})
	out := slices.Clone(le.Queue)
	for _, a := range objs {
		id := strings.TrimSuffix(strings.TrimPrefix(a.Name, prefix), ".json")
		if id != le.Holder && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// Release implements LeaseStore.
func (l *Leases) Release(ctx context.Context, namespace, cluster, runID string) (*Lease, string, error) {
	if err := l.leave(ctx, namespace, cluster, runID); err != nil {
		return nil, "", err
	}
	le, err := l.Get(ctx, namespace, cluster)
	if err != nil {
		return nil, "", err
	}
	if le.Holder != runID {
		if !slices.Contains(le.Queue, runID) {
			return le, "", nil
		}
		le, err = gcsdoc.Update(ctx, l.object(namespace, cluster), func(le *Lease, _ bool) error {
			if !slices.Contains(le.Queue, runID) {
				return gcsdoc.ErrNoChange
			}
			le.Queue = slices.DeleteFunc(le.Queue, func(s string) bool { return s == runID })
			le.Updated = l.Clock.Now()
			return nil
		}, leaseMeta)
		return le, "", err
	}
	// Hand over to the first in line; with nobody in line free the cluster,
	// then look again: a run may have queued after the first look (see
	// Acquire), and would otherwise wait for nobody.
	from := runID
	for range 2 {
		waiting, err := l.waiting(ctx, namespace, cluster, le)
		if err != nil {
			return nil, "", err
		}
		waiting = slices.DeleteFunc(waiting, func(s string) bool { return s == runID })
		next := ""
		if len(waiting) > 0 {
			next = waiting[0]
		}
		if next == "" && from == "" {
			return le, "", nil
		}
		if le, err = l.handTo(ctx, namespace, cluster, from, next); err != nil {
			return nil, "", err
		}
		if next != "" {
			if le.Holder != next {
				return le, "", nil // the run took the cluster itself meanwhile
			}
			return le, next, l.leave(ctx, namespace, cluster, next)
		}
		if le.Holder != "" {
			return le, "", nil
		}
		from = ""
	}
	return le, "", nil
}

// Get implements LeaseStore.
func (l *Leases) Get(ctx context.Context, namespace, cluster string) (*Lease, error) {
	var le Lease
	if _, err := gcsdoc.Read(ctx, l.object(namespace, cluster), &le); err != nil && !errors.Is(err, gcsdoc.ErrNotFound) {
		return nil, err
	}
	return &le, nil
}

// Held implements LeaseStore. It lists each namespace's folder under
// clusters/ without descending into the clusters' waiting folders, so a
// sweep pays a listing per namespace however many runs wait. A lease
// written by an earlier version has no holder metadata and is read.
func (l *Leases) Held(ctx context.Context) ([]HeldLease, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*gcsdoc.CallTimeout)
	defer cancel()
	namespaces, err := l.list(ctx, "clusters/")
	if err != nil {
		return nil, err
	}
	var out []HeldLease
	for _, nsDir := range namespaces {
		if nsDir.Prefix == "" {
			continue
		}
		objs, err := l.list(ctx, nsDir.Prefix)
		if err != nil {
			return nil, err
		}
		ns := strings.TrimSuffix(strings.TrimPrefix(nsDir.Prefix, "clusters/"), "/")
		for _, a := range objs {
			cluster, ok := strings.CutSuffix(strings.TrimPrefix(a.Name, nsDir.Prefix), ".json")
			if a.Prefix != "" || !ok {
				continue
			}
			holder, known := a.Metadata[metaHolder]
			updated, err := time.Parse(time.RFC3339Nano, a.Metadata[metaUpdated])
			if !known || err != nil {
				le, err := l.Get(ctx, ns, cluster)
				if err != nil {
					return nil, err
				}
				holder, updated = le.Holder, le.Updated
			}
			if holder != "" {
				out = append(out, HeldLease{Namespace: ns, Cluster: cluster, Holder: holder, Updated: updated})
			}
		}
	}
	return out, nil
}

// list lists one level under prefix: its objects and its folders (as
// attrs with Prefix set).
func (l *Leases) list(ctx context.Context, prefix string) ([]*storage.ObjectAttrs, error) {
	it := l.Bucket.Objects(ctx, &storage.Query{Prefix: prefix, Delimiter: "/"})
	var out []*storage.ObjectAttrs
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list the cluster leases under %s: %w", prefix, err)
		}
		out = append(out, a)
	}
}
