package probe

import (
	"slices"
	"sync"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
)

// Deliveries records the events the local Eventarc delivers on one route
// to its function, from WatchDeliveries until Stop.
type Deliveries struct {
	st    *stack.Stack
	mu    sync.Mutex
	spans []span
}

type span struct{ start, end time.Time }

// WatchDeliveries starts recording the deliveries of route (the stack's
// one observer: a second watch replaces the first).
func WatchDeliveries(st *stack.Stack, route string) *Deliveries {
	d := &Deliveries{st: st}
	st.Adapter.Observe(func(e eventarc.Delivery) {
		if e.Route == route && e.Outcome == eventarc.Delivered {
			d.mu.Lock()
			d.spans = append(d.spans, span{e.Start, e.Start.Add(e.Took)})
			d.mu.Unlock()
		}
	})
	return d
}

// Stop stops recording and returns how many deliveries there were, the
// most in flight at one time, and their mean length in milliseconds.
func (d *Deliveries) Stop() (n, most int, meanMs float64) {
	d.st.Adapter.Observe(nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	total := 0.0
	for _, s := range d.spans {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
		total += float64(s.end.Sub(s.start).Microseconds()) / 1000
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	open := 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	if len(d.spans) == 0 {
		return 0, 0, 0
	}
	return len(d.spans), most, total / float64(len(d.spans))
}
