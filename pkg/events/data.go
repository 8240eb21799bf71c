package events

import (
	"time"

	"github.com/raydrop/raydrop/pkg/runs"
)

// Data is the data of a run's public event of phase; gpuHourUSD is the
// price of a GPU-hour on a capacity tier that names none.
func Data(r *runs.Record, p runs.Phase, gpuHourUSD float64) Run {
	d := Run{
		RunID: r.RunID, Name: r.Name, Source: r.Source, SpecHash: r.SpecHash,
		Phase: p.Event(), Problems: r.Problems, Attempt: r.Attempt, Cluster: r.Cluster,
	}
	if r.Spec != nil {
		d.Images = &Images{Head: r.Spec.Cluster.HeadImage(), Workers: r.Spec.Cluster.WorkerImage(), Trainer: r.TrainerImage != ""}
	}
	d.Model = r.Model
	if t := r.Trial; t != nil {
		d.Trial = &TrialRef{SweepID: t.SweepID, Index: t.Index, Params: t.Params}
	}
	if p == r.Phase || p.Terminal() {
		d.Reason, d.Message = r.Reason, r.Message
	}
	if c := r.Cause; c != nil && (p.Terminal() || p == runs.ReportReady) {
		d.Cause, d.Summary, d.Hint = c.Kind, c.Summary, c.Hint
	}
	if p == runs.Running || p.Terminal() {
		d.Capacity = capacityOf(r, r.UpdatedAt)
		d.Startup = startupOf(r)
	}
	if a := r.CurrentAttempt(); p == runs.StallSuspected && a != nil && a.Stall != nil {
		s := a.Stall
		d.Stall = &Stall{Step: s.Step, Since: s.Since, SuspectedAt: s.SuspectedAt, WindowSeconds: s.Window.Seconds(),
			MedianStepSeconds: s.StepTime.Seconds(), Doing: s.Doing, Behind: s.Behind}
		d.Message = s.Summary()
	}
	if r.Check != nil && r.Check.Result != nil {
		d.DataCheck = r.Check.Result
	}
	if p == runs.ReportReady {
		// The report's own event: where it is and how the run ended (the
		// terminal event, already out, has the rest).
		d.Outcome, d.Report, d.Evidence = r.Phase.Event(), r.Report, r.Evidence
		d.Reason, d.Message = r.Reason, r.Message
		if t, ok := r.Times[r.Phase]; ok {
			d.EndedAt = &t
		}
		return d
	}
	if !p.Terminal() {
		return d
	}
	end := r.UpdatedAt
	if t, ok := r.Times[r.Phase]; ok {
		end = t
	}
	d.EndedAt = &end
	if t, ok := r.Times[runs.Accepted]; ok {
		d.StartedAt = &t
	} else if !r.CreatedAt.IsZero() {
		c := r.CreatedAt
		d.StartedAt = &c
	}
	d.Timings = timings(r, end)
	if d.Startup != nil {
		d.Timings["startup"] = d.Startup.Seconds
	}
	d.Report, d.Evidence = r.Report, r.Evidence
	if r.Result != nil {
		d.Checkpoints = r.Result.Checkpoints
		d.LatestCheckpoint = r.Result.Latest
		d.BestCheckpoint, d.BestBy = r.Result.Best, r.Result.BestBy
		d.FinalMetrics = r.Result.FinalMetrics
		if m := r.Result.Mark; m != nil {
			d.Data, d.Samples = m.Data, m.Samples
			if m.Samples != nil {
				d.Timings["sampleAnswers"] = m.Samples.Seconds
			}
		}
	}
	h, cost := GPUCost(r, end, gpuHourUSD)
	d.GPUHours, d.EstimatedCostUSD = &h, &cost
	return d
}

// capacityOf is where the current attempt's workers came from, nil for a
// run without an attempt.
func capacityOf(r *runs.Record, end time.Time) *Capacity {
	a := r.CurrentAttempt()
	if a == nil || r.Spec == nil {
		return nil
	}
	t := r.Spec.Tier(a.Tier)
	c := &Capacity{Tier: t.Name(), Type: t.Type, Index: a.Tier + 1, Served: a.RunningAt != nil, Waiting: a.Waiting}
	_, c.Preemptions = r.Lost()
	if a.RunningAt != nil {
		end = *a.RunningAt
	} else if a.EndedAt != nil {
		end = *a.EndedAt
	}
	c.WaitSeconds = max(end.Sub(a.CreatedAt).Seconds(), 0)
	return c
}

// startupOf is how the current attempt's workers came up (and how long
// its trainer took to its first report, once it has made one), nil before
// the monitor saw them all run.
func startupOf(r *runs.Record) *Startup {
	a := r.CurrentAttempt()
	if a == nil {
		return nil
	}
	p, ok := a.StartupParts()
	if !ok {
		return nil
	}
	s := &Startup{NodesSeconds: p.Nodes, ImageSeconds: p.Image, FirstStepSeconds: p.FirstStep, Seconds: p.Total()}
	if t := p.Trainer; t != nil {
		s.RuntimeEnvSeconds, s.WeightsSeconds, s.DataSeconds, s.StepSeconds = &t.RuntimeEnv, &t.Weights, &t.Data, &t.Steps
	}
	return s
}

// timings is the seconds spent in each phase the run went through, every
// entry counted (a retry's time in PROVISIONED goes to PROVISIONED), and the
// total.
func timings(r *runs.Record, end time.Time) map[string]float64 {
	out := map[string]float64{}
	for p, d := range r.Durations(end) {
		out[string(p)] = d.Seconds()
	}
	out["total"] = end.Sub(r.CreatedAt).Seconds()
	return out
}

// GPUCost is the GPU time the run used and its price: for every attempt
// that ran, the GPUs its workers use times the time from when they all ran
// to its end, at the price of the capacity tier that served it (the tier's
// gpuHourUsd, else price). An attempt still waiting for capacity holds no
// GPUs.
func GPUCost(r *runs.Record, end time.Time, price float64) (hours, usd float64) {
	if r.Spec == nil {
		return 0, 0
	}
	gpus := float64(r.Spec.Training.Workers)
	for _, a := range r.Attempts {
		if a.RunningAt == nil {
			continue
		}
		stop := end
		if a.EndedAt != nil {
			stop = *a.EndedAt
		}
		d := stop.Sub(*a.RunningAt)
		if d <= 0 {
			continue
		}
		p := price
		if t := r.Spec.Tier(a.Tier); t.GPUHourUSD > 0 {
			p = t.GPUHourUSD
		}
		hours += d.Hours() * gpus
		usd += d.Hours() * gpus * p
	}
	return hours, usd
}
