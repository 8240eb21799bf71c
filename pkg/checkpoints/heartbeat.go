package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
)

// HeartbeatDir is the folder of the ranks' heartbeats in an attempt's
// experiment folder: one rank-<NNNNN>.json per rank, rewritten by a thread
// of the rank's worker every 30 s (trainer/heartbeat.py).
const HeartbeatDir = "raydrop_heartbeat"

const maxBeat = 64 << 10

// Beat is one rank's heartbeat. Times are Unix seconds, as the trainer's
// clock read them; nil before the event they time.
type Beat struct {
	Rank int   `json:"rank"`
	Step int64 `json:"step"` // the last optimizer step that ended (global)
	// StepAt is when Step ended; FirstStepAt when this attempt's first
	// step did (the stall clock starts there).
	StepAt      *float64 `json:"stepAt"`
	FirstStepAt *float64 `json:"firstStepAt"`
	// StepSeconds is the median of the rank's recent step times.
	StepSeconds *float64 `json:"stepSeconds"`
	// Activity is what the rank does since ActivityAt: starting, training,
	// evaluating or saving (a checkpoint), ended.
	Activity   string   `json:"activity"`
	ActivityAt *float64 `json:"activityAt"`
	At         float64  `json:"at"` // when the beat was written
	PID        int      `json:"pid,omitempty"`
	Host       string   `json:"host,omitempty"`
}

// StacksRequest is the object, beside the heartbeats, by which the monitor
// asks every rank for its threads' stacks (StacksAsk); each rank answers a
// request once, in the attempt's evidence folder: StacksDir/rank-<NNNNN>.txt.
const (
	StacksRequest = "stacks-request.json"
	StacksDir     = "stacks"
)

// StacksAsk is the monitor's request for stacks.
type StacksAsk struct {
	ID  string    `json:"id"`
	Why string    `json:"why"`
	At  time.Time `json:"at"`
}

// StacksRequestName is the object of the request for stacks in experiment.
func StacksRequestName(experiment string) string {
	return strings.TrimSuffix(experiment, "/") + "/" + HeartbeatDir + "/" + StacksRequest
}

// StacksName is the object of rank's stacks under an evidence folder
// (a name prefix ending in /).
func StacksName(folder string, rank int) string {
	return fmt.Sprintf("%s%s/rank-%05d.txt", folder, StacksDir, rank)
}

// HeartbeatName is the object of rank's heartbeat in experiment.
func HeartbeatName(experiment string, rank int) string {
	return fmt.Sprintf("%s/%s/rank-%05d.json", strings.TrimSuffix(experiment, "/"), HeartbeatDir, rank)
}

// ReadBeats reads the attempt's heartbeats, by rank. A beat that does not
// parse is left out and named in bad: the trainer writes each whole, so
// only a foreign object is one.
func ReadBeats(ctx context.Context, st Store, experiment string) (beats []Beat, bad []string, err error) {
	prefix := strings.TrimSuffix(experiment, "/") + "/" + HeartbeatDir + "/"
	names, err := st.List(ctx, prefix)
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", st.URI(prefix), err)
	}
	for _, name := range names {
		if !strings.HasPrefix(path.Base(name), "rank-") || !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := st.Read(ctx, name, maxBeat)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", st.URI(name), err)
		}
		var beat Beat
		if err := json.Unmarshal(b, &beat); err != nil {
			bad = append(bad, st.URI(name))
			continue
		}
		beats = append(beats, beat)
	}
	sort.Slice(beats, func(i, j int) bool { return beats[i].Rank < beats[j].Rank })
	return beats, bad, nil
}

// Pulse is what the ranks' heartbeats say together.
type Pulse struct {
	Ranks int   // how many ranks beat
	Step  int64 // the furthest step any rank ended
	// FirstStep is when the attempt's first step ended (the earliest rank's);
	// zero before any has.
	FirstStep time.Time
	// Moved is the last sign of progress of any rank: a step's end, or the
	// start of what it does between steps (an evaluation, a save).
	Moved time.Time
	// StepTime is the median of the ranks' median step times; zero until a
	// rank has timed two steps.
	StepTime time.Duration
	// Behind is the ranks whose last step is before Step: in a data-parallel
	// run, the ranks that hold the others up.
	Behind []int
	// Doing is what the ranks that moved last are doing, as they say
	// (training, evaluating, saving).
	Doing string
	// Beat is when the last heartbeat was written.
	Beat time.Time
}

// PulseOf sums the ranks' heartbeats up; ok is false when there are none.
func PulseOf(beats []Beat) (p Pulse, ok bool) {
	if len(beats) == 0 {
		return Pulse{}, false
	}
	var medians []float64
	p.Ranks = len(beats)
	for _, b := range beats {
		p.Step = max(p.Step, b.Step)
		if t := unixTime(b.FirstStepAt); !t.IsZero() && (p.FirstStep.IsZero() || t.Before(p.FirstStep)) {
			p.FirstStep = t
		}
		for _, t := range []time.Time{unixTime(b.StepAt), unixTime(b.ActivityAt)} {
			if t.After(p.Moved) {
				p.Moved, p.Doing = t, b.Activity
			}
		}
		if s := b.StepSeconds; s != nil && *s > 0 && !math.IsInf(*s, 0) {
			medians = append(medians, *s)
		}
		if t := unixTime(&b.At); t.After(p.Beat) {
			p.Beat = t
		}
	}
	for _, b := range beats {
		if b.Step < p.Step {
			p.Behind = append(p.Behind, b.Rank)
		}
	}
	if len(medians) > 0 {
		p.StepTime = time.Duration(Median(medians) * float64(time.Second))
	}
	return p, true
}

// Median is the median of xs (not empty), which it leaves unchanged.
func Median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// unixTime is a Unix-seconds time (zero for nil, NaN or not positive).
func unixTime(s *float64) time.Time {
	if s == nil || math.IsNaN(*s) || math.IsInf(*s, 0) || *s <= 0 {
		return time.Time{}
	}
	sec, frac := math.Modf(*s)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}
