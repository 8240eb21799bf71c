package kubesim

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// beatEvery is how often the played ranks rewrite their heartbeats. The
// trainer's thread beats every 30 s (trainer/heartbeat.py); the local
// cloud's runs last seconds, so its beats come every second, as its Ray
// log copies do.
const beatEvery = time.Second

// heart plays every rank's heartbeat thread (trainer/heartbeat.py): from
// the train function's start, each rank's rank-<NNNNN>.json in the
// attempt's experiment folder, rewritten every beatEvery with the last
// step, its time, the first step's, the median step time and what the
// ranks do between steps. The ranks of a data-parallel run step together,
// so every beat tells the same. A hung run's beats go on with the step it
// hung after, as a real rank's thread does while its main thread waits in
// a collective.
type heart struct {
	t    *trainer
	mu   sync.Mutex
	beat checkpoints.Beat
	last time.Time
	took []float64 // step times, seconds
	stop chan struct{}
	done chan struct{}
	// answered is the request for stacks answered last (stacks.go).
	answered string
}

// startHeart starts the ranks' heartbeats.
func (t *trainer) startHeart(ctx context.Context) *heart {
	now := unixSeconds(time.Now())
	h := &heart{t: t, stop: make(chan struct{}), done: make(chan struct{}),
		beat: checkpoints.Beat{Step: int64(t.resumed), Activity: "starting", ActivityAt: &now}}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(beatEvery)
		defer tick.Stop()
		for {
			h.write(ctx)
			h.answer(ctx)
			select {
			case <-tick.C:
			case <-h.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return h
}

// step records the end of an optimizer step.
func (h *heart) step(step int) {
	if h == nil {
		return
	}
	now := time.Now()
	at := unixSeconds(now)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.last.IsZero() {
		h.took = append(h.took, now.Sub(h.last).Seconds())
	} else {
		h.beat.FirstStepAt = &at
	}
	h.last = now
	h.beat.Step, h.beat.StepAt = int64(step), &at
	h.beat.Activity, h.beat.ActivityAt = "training", &at
	if n := len(h.took); n > 0 {
		m := checkpoints.Median(h.took[max(0, n-50):])
		h.beat.StepSeconds = &m
	}
}

// note records what the ranks do from now between two steps.
func (h *heart) note(activity string) {
	if h == nil {
		return
	}
	at := unixSeconds(time.Now())
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beat.Activity, h.beat.ActivityAt = activity, &at
}

// write rewrites every rank's heartbeat. A failed write is tried again at
// the next beat, as the trainer's thread does.
func (h *heart) write(ctx context.Context) {
	h.mu.Lock()
	b := h.beat
	h.mu.Unlock()
	b.At = unixSeconds(time.Now())
	exp := h.t.a.experimentName()
	for rank := range h.t.a.numWorkers {
		b.Rank, b.PID, b.Host = rank, 4242+rank, "raydrop-worker"
		doc, _ := json.Marshal(b)
		if err := h.t.st.put(ctx, h.t.a.bucket, checkpoints.HeartbeatName(exp, rank), doc); err != nil && ctx.Err() == nil {
			h.t.p.log().Info("heartbeat not written", "err", err)
		}
	}
}

// end stops the heartbeats. A train function that returned or raised
// writes its last beat, "ended" (trainer/heartbeat.py's stop in a
// finally); a stopped job's processes are killed and write none.
func (h *heart) end(ctx context.Context, returned bool) {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	if returned {
		h.note("ended")
		h.write(ctx)
	}
}
