package sweeps

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
)

// TrialState is what a trial's run record says, for Advance: nothing
// (Exists false) for a trial not started or whose record is not written
// yet.
type TrialState struct {
	Exists bool
	Phase  runs.Phase
	Reason runs.Reason
	// Cause and Summary name why a trial that ended other than succeeded
	// did (runs.Cause).
	Cause, Summary string
	// EvalLosses is the held-out loss at each checkpoint it has written,
	// and EvalSteps each one's step.
	EvalLosses     []float64
	EvalSteps      []int64
	BestEvalLoss   *float64
	BestCheckpoint string
	Steps          int64
	// GPUHours and CostUSD so far (all of them once it has ended).
	GPUHours, CostUSD float64
}

// Plan is what an advance of the sweep decided, beyond the record it
// changed: the trials it started, and every trial started whose run record
// does not exist yet (those just started, and any a delivery that died
// left), which the caller creates, each once (its run ID is fixed).
type Plan struct {
	Started []int
	Create  []int
	// Ended: the sweep ended in this advance; its event is claimed.
	Ended bool
}

// Advance moves the sweep on from what its trials' runs say (states, by
// run ID), in the record being written: it notes what each trial found
// and which ended, starts the next trials (in order, while fewer than the
// sweep's parallel run, each on a cluster of the sweep no other trial of
// it holds, unless the sweep is cancelled or its budget used up), and
// ends the sweep once no trial runs and none will start. leaving is a
// trial run (or "") that is ending and hands its cluster over now: it
// holds no cluster, but the sweep does not end before it has.
func Advance(r *Record, states map[string]TrialState, leaving string, now time.Time) (Plan, bool) {
	var plan Plan
	changed := false
	for i := range r.Trials {
		t := &r.Trials[i]
		st, ok := states[t.RunID]
		if !t.Started() || !ok || !st.Exists {
			continue
		}
		if len(st.EvalLosses) > len(t.EvalLosses) {
			t.EvalLosses, t.EvalSteps = slices.Clone(st.EvalLosses), slices.Clone(st.EvalSteps)
			changed = true
		}
		if st.Steps != t.Steps || st.GPUHours != t.GPUHours || st.CostUSD != t.CostUSD {
			t.Steps, t.GPUHours, t.CostUSD = st.Steps, st.GPUHours, st.CostUSD
			changed = true
		}
		if t.Ended == "" && st.Phase.Terminal() {
			t.Ended, t.Reason, t.EndedAt = st.Phase, st.Reason, &now
			t.Cause, t.Summary = st.Cause, st.Summary
			t.BestEvalLoss, t.BestCheckpoint = st.BestEvalLoss, st.BestCheckpoint
			changed = true
		}
	}
	if r.Phase.Terminal() {
		return plan, changed
	}
	w := r.Spec.Sweep
	gpuHours, cost := r.Used()
	over := w.Budget.GPUHours > 0 && gpuHours >= w.Budget.GPUHours || w.Budget.CostUSD > 0 && cost >= w.Budget.CostUSD
	busy := map[string]bool{}
	active := 0
	for _, t := range r.Trials {
		if t.Active() && t.RunID != leaving {
			busy[t.Cluster] = true
			active++
		}
	}
	pending := false
	for i := range r.Trials {
		t := &r.Trials[i]
		if t.Started() {
			continue
		}
		pending = true
		if r.CancelRequested || over || active >= r.Spec.SweepParallel() {
			break
		}
		free := ""
		for _, c := range r.Spec.SweepClusters() {
			if !busy[c] {
				free = c
				break
			}
		}
		if free == "" {
			break
		}
		t.Cluster, t.StartedAt = free, &now
		busy[free] = true
		active++
		plan.Started = append(plan.Started, t.Index)
		changed = true
	}
	running := false
	for _, t := range r.Trials {
		if !t.Active() {
			continue
		}
		running = true
		if st := states[t.RunID]; !st.Exists {
			plan.Create = append(plan.Create, t.Index)
		}
	}
	// Trials left to start will start once a cluster is free, unless the
	// sweep is cancelled or its budget used up.
	willStart := pending && !r.CancelRequested && !over
	if !running && !willStart {
		r.end(over, now)
		plan.Ended, changed = true, true
	}
	return plan, changed
}

// Used is the GPU-hours and estimated cost of the trials so far.
func (r *Record) Used() (gpuHours, costUSD float64) {
	for _, t := range r.Trials {
		gpuHours += t.GPUHours
		costUSD += t.CostUSD
	}
	return gpuHours, costUSD
}

// end ends the sweep: cancelled when asked, else succeeded when a trial
// left a checkpoint (the best by held-out loss named), else failed.
func (r *Record) end(overBudget bool, now time.Time) {
	ran, ended := 0, 0
	for _, t := range r.Trials {
		if t.Started() {
			ran++
		}
		if t.Ended != "" {
			ended++
		}
	}
	r.Best = r.best()
	switch {
	case r.CancelRequested:
		r.Phase, r.Reason = Cancelled, "Cancelled"
		r.Message = fmt.Sprintf("cancelled: %d of %d trials ran", ran, len(r.Trials))
	case r.Best > 0 || r.anyCheckpoint():
		r.Phase = Succeeded
		r.Message = fmt.Sprintf("%d of %d trials ran", ran, len(r.Trials))
		if overBudget {
			r.Reason = "BudgetReached"
			r.Message = fmt.Sprintf("the budget was used after %d of %d trials", ran, len(r.Trials))
		}
	default:
		r.Phase, r.Reason = Failed, "NoTrialSucceeded"
		r.Message = fmt.Sprintf("none of the %d trials that ran left a checkpoint", ran)
	}
	r.EndedAt = &now
}

// best is the index of the trial with the lowest held-out loss (the
// earliest on a tie), 0 for none.
func (r *Record) best() int {
	best := 0
	var loss float64
	for _, t := range r.Trials {
		if t.BestEvalLoss != nil && t.BestCheckpoint != "" && (best == 0 || *t.BestEvalLoss < loss) {
			best, loss = t.Index, *t.BestEvalLoss
		}
	}
	return best
}

func (r *Record) anyCheckpoint() bool {
	return slices.ContainsFunc(r.Trials, func(t Trial) bool { return t.BestCheckpoint != "" || t.Ended == runs.Succeeded })
}

// MedianStop applies the sweep's median rule to trial runID, whose
// held-out losses at its checkpoints so far are losses: after its latest
// checkpoint k, it is stopped when its loss there is worse than the median
// of the other trials' losses at their checkpoint k, and at least
// earlyStopping.minTrials of them have one. It returns why, or "".
func MedianStop(r *Record, runID string, losses []float64) string {
	es := r.Spec.Sweep.EarlyStopping
	k := len(losses) - 1
	if es.Rule != "median" || k < 0 {
		return ""
	}
	var others []float64
	for _, t := range r.Trials {
		if t.RunID != runID && len(t.EvalLosses) > k {
			others = append(others, t.EvalLosses[k])
		}
	}
	if len(others) < es.MinTrials {
		return ""
	}
	med := median(others)
	if losses[k] <= med {
		return ""
	}
	return fmt.Sprintf("held-out loss %.4g at checkpoint %d is worse than the median %.4g of the %d other trials that reached it", losses[k], k+1, med, len(others))
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ClaimFor is how long a delivery's claim on the sweep's event holds the
// others off (pipeline.ClaimFor, for runs).
const ClaimFor = 10 * time.Second

// Claim takes, in the record being written, the right to publish the
// sweep's terminal event: false when it has gone out, the sweep has not
// ended, or another delivery holds a fresh claim.
func (r *Record) Claim(now time.Time) bool {
	if r.Published || !r.Phase.Terminal() || r.Publishing != nil && now.Sub(*r.Publishing) < ClaimFor {
		return false
	}
	r.Publishing = &now
	return true
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}
