package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/gcstest"
)

func leases(t *testing.T) *Leases {
	t.Helper()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	return &Leases{Bucket: gcstest.New(t, "b").Bucket("b"), Clock: func() time.Time { return now }}
}

// TestLeaseSteps plays a lease's life step by step. Queueing writes the
// run's own waiting object, never the lease: the lease changes only when
// the cluster changes hands.
func TestLeaseSteps(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	type step struct {
		op, run    string
		holder     string
		waiting    []string
		next       string
		wantChange bool // of the lease object
	}
	for i, s := range []step{
		{"acquire", "a", "a", nil, "", true},
		{"acquire", "a", "a", nil, "", false}, // a redelivery changes nothing
		{"acquire", "b", "a", []string{"b"}, "", false},
		{"acquire", "c", "a", []string{"b", "c"}, "", false},
		{"acquire", "b", "a", []string{"b", "c"}, "", false}, // queued once
		{"release", "c", "a", []string{"b"}, "", false},      // a queued run leaves the queue
		{"release", "x", "a", []string{"b"}, "", false},      // a stranger changes nothing
		{"release", "a", "b", nil, "b", true},                // the holder hands over to the first queued
		{"release", "b", "", nil, "", true},
		{"release", "b", "", nil, "", false},
	} {
		before, _ := l.Get(ctx, "ns", "c")
		var got *Lease
		var next string
		var err error
		if s.op == "acquire" {
			got, err = l.Acquire(ctx, "ns", "c", s.run)
		} else {
			got, next, err = l.Release(ctx, "ns", "c", s.run)
		}
		if err != nil {
			t.Fatalf("step %d %s %s: %v", i, s.op, s.run, err)
		}
		stored, _ := l.Get(ctx, "ns", "c")
		waiting, err := l.Waiting(ctx, "ns", "c")
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != s.holder || !slices.Equal(waiting, s.waiting) || next != s.next || stored.Holder != s.holder {
			t.Errorf("step %d %s %s: lease %+v (stored %+v) waiting %v next %q; want holder %q waiting %v next %q", i, s.op, s.run, got, stored, waiting, next, s.holder, s.waiting, s.next)
		}
		changed := before.Holder != stored.Holder || !before.Updated.Equal(stored.Updated)
		if changed != s.wantChange {
			t.Errorf("step %d %s %s: lease changed %v, want %v", i, s.op, s.run, changed, s.wantChange)
		}
	}
	if le, err := l.Get(ctx, "ns", "never-leased"); err != nil || le.Holder != "" || len(le.Queue) != 0 {
		t.Errorf("a cluster nobody leased: %+v %v", le, err)
	}
}

// TestLeaseOfAnEarlierVersion: runs queued in the lease itself, as earlier
// versions queued them, get the cluster first, then the runs queued since.
func TestLeaseOfAnEarlierVersion(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	if err := gcsdoc.Write(ctx, l.object("ns", "c"), Lease{Holder: "a", Queue: []string{"old1", "old2"}}, storage.Conditions{DoesNotExist: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "ns", "c", "new"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Release(ctx, "ns", "c", "old2"); err != nil { // cancelled while it waited
		t.Fatal(err)
	}
	var order []string
	for holder := "a"; holder != ""; {
		_, next, err := l.Release(ctx, "ns", "c", holder)
		if err != nil {
			t.Fatal(err)
		}
		if next != "" {
			order = append(order, next)
		}
		holder = next
	}
	if want := []string{"old1", "new"}; !slices.Equal(order, want) {
		t.Errorf("handed over to %v, want %v", order, want)
	}
}

// TestQueueingWhileReleased: a run that queues while the holder releases
// the cluster is never left waiting for nobody: either the holder hands the
// cluster to it, or it takes the free cluster itself.
func TestQueueingWhileReleased(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	for i := range 12 {
		cluster := fmt.Sprintf("c%d", i)
		if _, err := l.Acquire(ctx, "ns", cluster, "a"); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := l.Acquire(ctx, "ns", cluster, "b"); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if _, _, err := l.Release(ctx, "ns", cluster, "a"); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		le, _ := l.Get(ctx, "ns", cluster)
		waiting, err := l.Waiting(ctx, "ns", cluster)
		if err != nil {
			t.Fatal(err)
		}
		if le.Holder != "b" || len(waiting) != 0 {
			t.Errorf("%s: holder %q, waiting %v; want b holding, nobody waiting", cluster, le.Holder, waiting)
		}
	}
}

// TestLeaseHasOneHolder: runs admitted at once never both hold the cluster,
// and every one of them is either the holder or queued.
func TestLeaseHasOneHolder(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	runs := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	var mu sync.Mutex
	holders := map[string]bool{}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() {
			le, err := l.Acquire(ctx, "ns", "c", r)
			if err != nil {
				t.Error(err)
				return
			}
			if le.Holder == r {
				mu.Lock()
				holders[r] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	le, _ := l.Get(ctx, "ns", "c")
	waiting, err := l.Waiting(ctx, "ns", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 1 || !holders[le.Holder] || len(waiting) != len(runs)-1 || slices.Contains(waiting, le.Holder) {
		t.Errorf("holders %v, lease %+v, waiting %v; want one holder, the rest queued", holders, le, waiting)
	}
}

// TestLeasesHeld lists the held leases of every namespace, their holders
// and times read from the listing's metadata, or from the lease itself for
// a lease of an earlier version; free leases and waiting runs are not
// listed.
func TestLeasesHeld(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	for _, a := range []struct{ ns, cluster, run string }{
		{"team-a", "c1", "r1"}, {"team-a", "c1", "r2"}, {"team-a", "c2", "r3"}, {"team-b", "c1", "r4"}, {"team-b", "c3", "r5"},
	} {
		if _, err := l.Acquire(ctx, a.ns, a.cluster, a.run); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := l.Release(ctx, "team-b", "c3", "r5"); err != nil {
		t.Fatal(err)
	}
	earlier := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	legacy := &Lease{Holder: "r6", Queue: []string{"r7"}, Updated: earlier}
	if err := gcsdoc.Write(ctx, l.object("team-c", "old"), legacy, storage.Conditions{DoesNotExist: true}, nil); err != nil {
		t.Fatal(err)
	}
	held, err := l.Held(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := l.Clock.Now()
	want := []HeldLease{
		{"team-a", "c1", "r1", now}, {"team-a", "c2", "r3", now}, {"team-b", "c1", "r4", now}, {"team-c", "old", "r6", earlier},
	}
	slices.SortFunc(held, func(a, b HeldLease) int { return strings.Compare(a.Namespace+a.Cluster, b.Namespace+b.Cluster) })
	if len(held) != len(want) {
		t.Fatalf("Held() = %+v, want %+v", held, want)
	}
	for i := range want {
		if held[i].Namespace != want[i].Namespace || held[i].Cluster != want[i].Cluster || held[i].Holder != want[i].Holder || !held[i].Updated.Equal(want[i].Updated) {
			t.Errorf("Held()[%d] = %+v, want %+v", i, held[i], want[i])
		}
	}
}
