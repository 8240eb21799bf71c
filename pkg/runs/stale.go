package runs

import "time"

// StaleStep is how long a run's record may stay unchanged in a step that a
// message carries on (ACCEPTED, PROVISIONED, FINISHING, or ended but not
// announced) before the monitor's sweep counts the step as stalled and
// drives it on: it re-admits the run or resends the step's message.
// SUBMITTED and RUNNING runs are checked on every tick whatever their age.
const StaleStep = 20 * time.Second

// RecoveryBound is the longest a run stalls after the instance handling it
// died, with ticks every tick: its last write is at most StaleStep old when
// a sweep first sees it stale, and that sweep comes at most one tick later.
// After that the run goes on as it would have. A redelivery of the dead
// delivery usually comes sooner: Eventarc retries after 10 s or more, when
// the dead delivery's claim has expired.
func RecoveryBound(tick time.Duration) time.Duration { return StaleStep + tick }
