package kubesim

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/raydrop/raydrop/pkg/spec"
)

// A scenario is written as "outcome=fail,at=5,steps=4,step=100ms": the
// local cloud reads it from a spec object's custom metadata (and its
// default from Options.DefaultSim), so tests pick how each run's simulated
// Ray job plays without touching the job spec format.

// parsePreempt reads preempt=3/7: the step each attempt loses a node at.
func parsePreempt(v string) ([]int, error) {
	var at []int
	for _, s := range strings.Split(v, "/") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("preempt=%s: %q is not a step (give steps such as preempt=3/7)", v, s)
		}
		at = append(at, n)
	}
	return at, nil
}

// ParseScenario reads "outcome=fail,at=5,steps=4,step=100ms" over the
// default scenario.
func ParseScenario(text string) (Scenario, error) {
	sc := DefaultScenario()
	if strings.TrimSpace(text) == "" {
		return sc, nil
	}
	for _, kv := range strings.Split(text, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		var err error
		switch k {
		case "outcome":
			sc.Outcome = Outcome(v)
			if ok, allowed := knownOutcome(sc.Outcome); !ok {
				err = fmt.Errorf("outcome=%s: unknown (allowed: %s)", v, allowed)
			}
		case "rank":
			var r int
			if r, err = strconv.Atoi(v); err == nil && r < 0 {
				err = fmt.Errorf("rank=%s: a rank is 0 or more", v)
			}
			sc.Rank = &r
		case "at":
			sc.At, err = strconv.Atoi(v)
		case "steps":
			sc.StepsPerEpoch, err = strconv.Atoi(v)
		case "step":
			sc.StepTime, err = time.ParseDuration(v)
		case "pending":
			sc.PendingFor, err = time.ParseDuration(v)
		case "pull":
			sc.Pull, err = time.ParseDuration(v)
		case "env":
			sc.Env, err = time.ParseDuration(v)
		case "weights":
			sc.Weights, err = time.ParseDuration(v)
		case "data":
			sc.Data, err = time.ParseDuration(v)
		case "dropped":
			sc.DroppedRows, err = strconv.Atoi(v)
		case "refuse":
			sc.Refuse, err = parseRefuse(v)
		case "preempt":
			sc.PreemptAt, err = parsePreempt(v)
		case "hangs":
			if sc.Hangs, err = strconv.Atoi(v); err == nil && sc.Hangs < 1 {
				err = fmt.Errorf("hangs=%s: the attempts that hang are 1 or more", v)
			}
		case "preemptAs":
			switch o := Outcome(v); o {
			case Preempt, Reclaim, ReclaimInSave:
				sc.PreemptAs = o
			default:
				err = fmt.Errorf("preemptAs=%s: allowed: preempt (the save on notice ends), reclaim (the node goes mid-step), reclaim-in-save (the node goes during the save)", v)
			}
		default:
			err = fmt.Errorf("unknown key %q (allowed: outcome, at, rank, steps, step, pending, pull, env, weights, data, dropped, refuse, preempt, preemptAs, hangs)", k)
		}
		if err != nil {
			return sc, fmt.Errorf("scenario %q: %w", text, err)
		}
	}
	return sc, nil
}

// parseRefuse reads refuse=reservation:20s/flexStart: the capacity tiers
// with no nodes, each for how long (none: for the whole job).
func parseRefuse(v string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, item := range strings.Split(v, "/") {
		tier, d, timed := strings.Cut(item, ":")
		if !slices.Contains(spec.TierTypes, tier) {
			return nil, fmt.Errorf("refuse: unknown capacity tier %q (allowed: %s)", tier, strings.Join(spec.TierTypes, ", "))
		}
		out[tier] = 0
		if timed {
			dur, err := time.ParseDuration(d)
			if err != nil || dur <= 0 {
				return nil, fmt.Errorf("refuse: %s:%s is not a positive duration", tier, d)
			}
			out[tier] = dur
		}
	}
	return out, nil
}

// ForAttempt is how attempt n of the run plays: a lost head is a one-off
// accident, so the retry that follows runs clean; with preempt=3/7, attempt
// n loses a node at the n-th step listed and the attempts after the list
// succeed; with hangs=N, the first N attempts hang and the next succeed.
func (sc Scenario) ForAttempt(n int) Scenario {
	if sc.Outcome == LoseHead && n != 1 || sc.Outcome == Hang && sc.Hangs > 0 && n > sc.Hangs {
		sc.Outcome = Succeed
	}
	if at := sc.PreemptAt; len(at) > 0 {
		sc.Outcome = Succeed
		if n >= 1 && n <= len(at) {
			sc.Outcome, sc.At = cmp.Or(sc.PreemptAs, Preempt), at[n-1]
		}
	}
	return sc
}
