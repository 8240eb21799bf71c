package pipeline

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/gcstest"
)

func leases(t *testing.T) *Leases {
	t.Helper()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	return &Leases{Bucket: gcstest.New(t, "b").Bucket("b"), Clock: func() time.Time { return now }}
}

// TestLeaseSteps plays a lease's life step by step.
func TestLeaseSteps(t *testing.T) {
	l := leases(t)
	ctx := context.Background()
	type step struct {
		op, run    string
		holder     string
		queue      []string
		next       string
		wantChange bool
	}
	for i, s := range []step{
		{"acquire", "a", "a", nil, "", true},
		{"acquire", "a", "a", nil, "", false}, // a redelivery changes nothing
		{"acquire", "b", "a", []string{"b"}, "", true},
		{"acquire", "c", "a", []string{"b", "c"}, "", true},
		{"acquire", "b", "a", []string{"b", "c"}, "", false}, // queued once
		{"release", "c", "a", []string{"b"}, "", true},       // a queued run leaves the queue
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
		if got.Holder != s.holder || !slices.Equal(got.Queue, s.queue) || next != s.next || stored.Holder != s.holder || !slices.Equal(stored.Queue, s.queue) {
			t.Errorf("step %d %s %s: lease %+v (stored %+v) next %q; want holder %q queue %v next %q", i, s.op, s.run, got, stored, next, s.holder, s.queue, s.next)
		}
		changed := !slices.Equal(before.Queue, stored.Queue) || before.Holder != stored.Holder || !before.Updated.Equal(stored.Updated)
		if changed != s.wantChange {
			t.Errorf("step %d %s %s: changed %v, want %v", i, s.op, s.run, changed, s.wantChange)
		}
	}
	if le, err := l.Get(ctx, "ns", "never-leased"); err != nil || le.Holder != "" || len(le.Queue) != 0 {
		t.Errorf("a cluster nobody leased: %+v %v", le, err)
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
	if len(holders) != 1 || !holders[le.Holder] || len(le.Queue) != len(runs)-1 || slices.Contains(le.Queue, le.Holder) {
		t.Errorf("holders %v, lease %+v; want one holder, the rest queued", holders, le)
	}
}
