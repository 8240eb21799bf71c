package monitor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/runs"
)

// sweepWorkers is how many runs a sweep checks at once.
const sweepWorkers = 32

// Sweep is a tick's work: it checks every active (or ended but
// unannounced) run against one LIST of RayJobs and one of worker pods, which also re-admits
// waiting runs and resends stalled steps, then scales down clusters that
// have workers and no active run, and publishes the events the message
// bus still owes.
func (h *Handler) Sweep(ctx context.Context) error {
	sums, err := h.Deps.Runs.List(ctx)
	if err != nil {
		return err
	}
	jobs, err := h.listJobs(ctx)
	if err != nil {
		return err
	}
	workers, err := h.listWorkers(ctx)
	if err != nil {
		return err
	}
	lost, err := h.listLost(ctx)
	if err != nil {
		return err
	}
	busy, known, ended := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var todo []string
	queued := map[string][]string{} // by cluster, namespace/name
	for _, s := range sums {
		known[s.RunID], ended[s.RunID] = true, s.Phase.Terminal()
		if !s.Phase.Terminal() { // an unknown phase counts as busy: it keeps its workers
			busy[s.Cluster] = true
		}
		switch {
		case s.Phase == runs.Queued && !s.CancelRequested:
			queued[s.Cluster] = append(queued[s.Cluster], s.RunID)
		case s.Phase.Active() || s.Unannounced || !s.Phase.Known():
			todo = append(todo, s.RunID) // an unknown phase fails its check, which is logged
		}
	}
	var errs []error
	// A queued run needs the sweep only when its cluster is stuck: one look
	// per cluster, not per run (thousands of runs may wait).
	for cluster, ids := range queued {
		ns, name, _ := strings.Cut(cluster, "/")
		stuck, err := h.stuck(ctx, ns, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if stuck {
			todo = append(todo, ids...)
		}
	}
	errs = append(errs, h.checkAll(ctx, todo, &listing{jobs: jobs, workers: workers, lost: lost})...)
	errs = append(errs, h.advanceSweeps(ctx)...)
	errs = append(errs, h.releaseOrphans(ctx, known, ended, queued)...)
	scaled, err := h.scaleDownIdle(ctx, busy)
	if err != nil {
		errs = append(errs, err)
	}
	// The events the message bus did not take when they were published.
	busSent, busOwed, err := h.Deps.RetryBus(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	h.Deps.Log.Info("sweep_done", "active_runs", len(todo), "rayjobs", len(jobs), "scaled_to_zero", scaled, "bus_published", busSent, "bus_owed", busOwed)
	// A tick that failed for one run is not redelivered: the next tick
	// comes in a minute and sweeps everything again.
	if len(errs) > 0 {
		h.Deps.Log.Warn("sweep_incomplete", "errors", len(errs), "first", errs[0].Error())
	}
	return nil
}

// managed selects what raydrop made.
var managed = metav1.ListOptions{LabelSelector: names.LabelManagedBy + "=" + names.ManagedBy}

// listJobs lists every RayJob raydrop made, by name, in the namespaces
// runs may use (the functions may list nowhere else).
func (h *Handler) listJobs(ctx context.Context) (map[string]*rayv1.RayJob, error) {
	jobs := map[string]*rayv1.RayJob{}
	for _, ns := range h.Deps.Config.Namespaces {
		list, err := h.Deps.Ray.RayV1().RayJobs(ns).List(ctx, managed)
		if err != nil {
			return nil, fmt.Errorf("list rayjobs in %s: %w", ns, err)
		}
		for i := range list.Items {
			jobs[list.Items[i].Name] = &list.Items[i]
		}
	}
	return jobs, nil
}

// listClusters lists every RayCluster raydrop made in the namespaces runs
// may use.
func (h *Handler) listClusters(ctx context.Context) ([]rayv1.RayCluster, error) {
	var out []rayv1.RayCluster
	for _, ns := range h.Deps.Config.Namespaces {
		list, err := h.Deps.Ray.RayV1().RayClusters(ns).List(ctx, managed)
		if err != nil {
			return nil, fmt.Errorf("list rayclusters in %s: %w", ns, err)
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

// checkAll checks runs side by side (each check is a few Cloud Storage
// reads: one after another, a thousand active runs would take minutes at
// cloud latencies) and returns the checks' errors, each logged.
func (h *Handler) checkAll(ctx context.Context, runIDs []string, listed *listing) []error {
	var mu sync.Mutex
	var errs []error
	g := errgroup.Group{}
	g.SetLimit(sweepWorkers)
	for _, runID := range runIDs {
		g.Go(func() error {
			if err := h.check(ctx, runID, listed); err != nil {
				h.Deps.Log.Warn("sweep_check_failed", "run_id", runID, "error", err.Error(), "permanent", pipeline.IsPermanent(err))
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // the checks report through errs
	return errs
}

// stuck reports whether the runs queued on a cluster need the sweep: the
// cluster is free, or its holder is gone (holderGone), or was handed the
// cluster and never started (its handing over died before it).
func (h *Handler) stuck(ctx context.Context, namespace, cluster string) (bool, error) {
	lease, err := h.Deps.Leases.Get(ctx, namespace, cluster)
	if err != nil || lease.Holder == "" {
		return err == nil, err
	}
	holder, err := h.Deps.Runs.Get(ctx, lease.Holder)
	if err == nil && (holder.Phase == runs.Queued || holder.Phase == runs.Accepted) {
		return true, nil
	}
	return h.holderGone(lease, holder, err)
}

// holderGone reports, from the lease and the read of its holder's record,
// whether the holder has ended (or has had no record for
// HolderWithoutRecord) without handing the cluster over.
func (h *Handler) holderGone(lease *pipeline.Lease, holder *runs.Record, err error) (bool, error) {
	switch {
	case errors.Is(err, runs.ErrNotFound):
		// Its delivery may be creating its record.
		return h.Deps.Time().Sub(lease.Updated) > pipeline.HolderWithoutRecord, nil
	case err != nil:
		return false, err
	}
	// A failed run that keeps its head for a look keeps its cluster until
	// the sweep passes it on (releaseOrphans).
	kept := holder.HeadKept != nil && holder.HeadKept.ReleasedAt == nil || holder.KeepsHead(h.Deps.Time())
	return holder.Phase.Terminal() && !kept, nil
}

// readmit gives a queued (or stalled accepted) run the cluster when its
// holder is gone.
func (h *Handler) readmit(ctx context.Context, rec *runs.Record) error {
	d := h.Deps
	lease, err := d.Leases.Get(ctx, rec.Namespace, rec.Cluster)
	if err != nil {
		return err
	}
	if lease.Holder != "" && lease.Holder != rec.RunID {
		holder, err := d.Runs.Get(ctx, lease.Holder)
		gone, err := h.holderGone(lease, holder, err)
		if err != nil || !gone {
			return err // the holder is still at work, or its record is being created
		}
		d.Log.Warn("lease_released", "cluster", rec.Cluster, "holder", lease.Holder, "why", "holder ended")
		if _, _, err := d.Leases.Release(ctx, rec.Namespace, rec.Cluster, lease.Holder); err != nil {
			return err
		}
	}
	if rec.Phase == runs.Queued {
		return d.Admit(ctx, rec)
	}
	if d.Time().Sub(rec.UpdatedAt) > runs.StaleStep {
		// The intake delivery stopped after recording the run: announce it
		// (a claim left by a delivery that died has expired by now), then
		// admit it, as that delivery would have.
		if rec, err = d.Announce(ctx, rec, runs.Accepted); err != nil {
			return err
		}
		return d.Admit(ctx, rec)
	}
	return nil
}

// scaleDownIdle scales to zero every raydrop cluster that asks for workers
// while no active run uses it and nobody has held it for the grace period.
func (h *Handler) scaleDownIdle(ctx context.Context, busy map[string]bool) (int, error) {
	d := h.Deps
	clusters, err := h.listClusters(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range clusters {
		rc := &clusters[i]
		if !pipeline.HasWorkers(rc) || busy[rc.Namespace+"/"+rc.Name] {
			continue
		}
		lease, err := d.Leases.Get(ctx, rc.Namespace, rc.Name)
		if err != nil {
			return n, err
		}
		if d.Time().Sub(lease.Updated) < d.Config.ScaleDownAge {
			continue
		}
		if _, err := d.ScaleToZero(ctx, rc.Namespace, rc.Name); err != nil {
			return n, err
		}
		d.Log.Warn("cluster_scaled_to_zero", "cluster", rc.Namespace+"/"+rc.Name, "why", "workers and no active run")
		n++
	}
	return n, nil
}
