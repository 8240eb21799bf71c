package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// fanout drops one sweep of n trials (random learning rates, log-uniform)
// over clusters clusters, and measures: the time until its record exists with
// every trial expanded and validated (admitted); the time until its first
// wave, one trial per cluster, has each trial's RayJob created (fanned
// out); then, cancelled, the time until every trial started has ended and
// the sweep's cancelled event is out.
func (b *bench) fanout(n, clusters int) error {
	ctx := b.ctx
	var names []any
	for i := range clusters {
		names = append(names, fmt.Sprintf("bench-sweep-%d", i))
	}
	data, err := probe.Spec(b.spec, "bench-sweep-0", output, map[string]any{"sweep": map[string]any{
		"parameters": []any{map[string]any{"path": "training.learningRate", "min": 1e-5, "max": 1e-3, "scale": "log"}},
		"search":     "random",
		"trials":     n,
		"seed":       1,
		"clusters":   names,
	}})
	if err != nil {
		return err
	}
	store := &sweeps.Store{Bucket: b.st.GCS.Bucket(stack.StateBucket)}
	t0 := time.Now()
	id, err := probe.Upload(ctx, b.st, fmt.Sprintf("sweep-%d", n), data, "steps=1,step=10m")
	if err != nil {
		return err
	}
	var admitted, fanned time.Duration
	var sw *sweeps.Record
	for time.Since(t0) < 3*time.Minute {
		if sw, err = store.Get(ctx, id); err == nil && admitted == 0 {
			admitted = time.Since(t0)
		}
		if sw != nil && b.submitted(ctx, sw) >= clusters {
			fanned = time.Since(t0)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fanned == 0 {
		return fmt.Errorf("the sweep's first %d trials were not submitted within 3 minutes", clusters)
	}
	b.add("fanout", fmt.Sprintf("a %d-trial sweep admitted (its record, every trial validated)", n), admitted.Seconds(), "s", -1, fmt.Sprintf("%d bytes of spec", len(data)))
	b.add("fanout", fmt.Sprintf("its first %d trials' RayJobs created, one per cluster", clusters), fanned.Seconds(), "s", -1, "from the upload")
	w := b.st.GCS.Bucket(stack.IntakeBucket).Object("cancel/" + id).NewWriter(ctx)
	if err := w.Close(); err != nil {
		return err
	}
	t1 := time.Now()
	for time.Since(t1) < 3*time.Minute {
		if sw, err = store.Get(ctx, id); err == nil && sw.Phase.Terminal() && sw.Published {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sw == nil || !sw.Published {
		return fmt.Errorf("the cancelled sweep did not end within 3 minutes")
	}
	started := 0
	for _, t := range sw.Trials {
		if t.Started() {
			started++
		}
	}
	b.add("fanout", "cancelled: every trial started ended and the sweep announced", time.Since(t1).Seconds(), "s", -1, fmt.Sprintf("%d of %d trials had started", started, n))
	raw, _ := json.Marshal(sw)
	b.add("fanout", "the sweep record's size", float64(len(raw))/1024, "KiB", -1, "")
	return nil
}

// submitted counts the sweep's trials whose RayJob exists.
func (b *bench) submitted(ctx context.Context, sw *sweeps.Record) int {
	n := 0
	for _, t := range sw.Trials {
		if !t.Started() {
			continue
		}
		if r, err := probe.Runs(b.st).Get(ctx, t.RunID); err == nil && (r.Phase == runs.Submitted || r.Phase == runs.Running) {
			n++
		}
	}
	return n
}
