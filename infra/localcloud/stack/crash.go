package stack

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/faults"
)

// Crash plans: a function process killed right after a chosen write.

// Crash is a function process killed mid-handler by a crash plan.
type Crash struct {
	Function string
	// After is the write the process sent last, which the service carried
	// out: "PUT /storage/v1/b/raydrop-intake/o/runs%2F..." and the like.
	After string
	At    time.Time
}

type crashPlan struct {
	fn    string
	left  int
	match func(faults.Request) bool
	fired chan struct{}
	done  chan Crash
}

// CrashAt kills fn's process right after the service carried out its nth
// write (through either proxy) that match accepts (nil: any), before the
// process sees the answer, then restarts it after restartAfter, as Cloud
// Run replaces a crashed instance. The channel gets the crash; cancel
// disarms a plan that has not fired.
func (s *Stack) CrashAt(fn string, nth int, match func(faults.Request) bool, restartAfter time.Duration) (crashed <-chan Crash, cancel func()) {
	p := &crashPlan{fn: fn, left: nth, match: match, fired: make(chan struct{}), done: make(chan Crash, 1)}
	s.crashMu.Lock()
	s.crashes = append(s.crashes, p)
	s.crashMu.Unlock()
	disarmed := make(chan struct{})
	go func() {
		select {
		case <-p.fired:
		case <-disarmed:
			return
		}
		time.Sleep(restartAfter)
		if err := s.Restart(context.Background(), fn); err != nil {
			s.opts.Log.Error("restart after crash", "function", fn, "error", err.Error())
		}
	}()
	var once sync.Once
	return p.done, func() {
		once.Do(func() {
			s.crashMu.Lock()
			defer s.crashMu.Unlock()
			for i, q := range s.crashes {
				if q == p {
					s.crashes = append(s.crashes[:i], s.crashes[i+1:]...)
					close(disarmed)
					return
				}
			}
		})
	}
}

func (s *Stack) crashHook(r faults.Request) {
	if !r.Write || r.Status == 0 {
		return
	}
	s.crashMu.Lock()
	var fire *crashPlan
	for i, p := range s.crashes {
		if p.fn != r.Client || (p.match != nil && !p.match(r)) {
			continue
		}
		if p.left--; p.left == 0 {
			fire = p
			s.crashes = append(s.crashes[:i], s.crashes[i+1:]...)
		}
		break
	}
	s.crashMu.Unlock()
	if fire == nil {
		return
	}
	s.funcs[fire.fn].kill()
	s.opts.Log.Warn("function killed mid-handler", "function", fire.fn, "after", r.Method+" "+r.Path)
	c := Crash{Function: fire.fn, After: r.Method + " " + r.Path, At: time.Now()}
	s.crashMu.Lock()
	s.killed = append(s.killed, c)
	s.crashMu.Unlock()
	fire.done <- c
	close(fire.fired)
}

// Kills lists every crash plan that fired, in order. A kill ends every
// delivery the process was handling, not only the one whose write fired it.
func (s *Stack) Kills() []Crash {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	return slices.Clone(s.killed)
}
