// Package drain measures how fast a backlog drains, in tokens per second
// of completed work, and so how long a given amount of waiting work takes:
// the one estimate behind the scheduler's deadline check (a request that
// cannot be served within its class's deadline is refused at once) and
// behind Retry-After. A Rate is a plain value; its owner guards it.
package drain

import (
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// Rate is one model's drain rate. It is measured only while requests
// wait: when nobody waits, a completion says how busy clients were, not
// how fast the workers are, and an idle hour must not read as a slow
// worker. The zero value has measured nothing.
type Rate struct {
	since  time.Time // start of the current window
	tokens float64   // completed since
	rate   stats.EMA // tokens/s
}

// TimeFor is how long work (tokens) takes at the measured rate; false
// while the rate is unmeasured (r nil).
func (r *Rate) TimeFor(work float64) (time.Duration, bool) {
	if r == nil || !r.rate.Known() || r.rate.Value <= 0 {
		return 0, false
	}
	return time.Duration(work / r.rate.Value * float64(time.Second)), true
}

// minWindow is the shortest window a sample is taken over, so that two
// completions a moment apart do not read as an infinite rate.
const minWindow = time.Second

// Drained accounts tokens completed at now while the backlog that began
// at backlog waits. The first completion of a backlog starts the window
// rather than the backlog itself: the requests in flight when a backlog
// begins are, on average, the long ones, and counting from its start
// would read their remaining time as a slow drain.
func (r *Rate) Drained(tokens float64, backlog, now time.Time) {
	if r.since.Before(backlog) {
		r.since, r.tokens = now, 0 // a new backlog: a fresh window
		return
	}
	r.tokens += tokens
	if dt := now.Sub(r.since); dt >= minWindow {
		r.rate = r.rate.Add(r.tokens/dt.Seconds(), 0.2)
		r.since, r.tokens = now, 0
	}
}
