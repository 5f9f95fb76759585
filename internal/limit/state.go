package limit

// A worker's limit at a pick and its reason in words.

import (
	"fmt"
	"time"
)

// State is a worker's limit at one moment, with the facts behind it;
// the reason is put in words only when a record or API is read, so the
// hot path formats nothing.
type State struct {
	Limit   int    // in force for a new request
	Learned int    // what the controller learned (limit without borrowing)
	Cap     int    // the most it may ever be
	Source  Source // where it came from
	Floor   float64
	Sat     Saturation // SatQueue or SatKV when telemetry capped it
	// Prefix >0: one stream over the learned limit for a request this
	// much of whose prefix is cached (set by the scheduler's affinity
	// rule).
	Prefix float64

	why      uint8         // one of the why* constants below
	level    int           // the level the reason is about
	n        int64         // samples at that level
	p        float64       // its pessimistic rate
	age      time.Duration // age of its verdict (re-probe)
	satVal   float64
	ttft     float64       // whyBad, first tokens first: the level's mean TTFT (ms)
	ttftHeld float64       // and what a request held one level below would see (ms)
	borrow   int           // streams borrowed over the learned limit
	waited   time.Duration // the queue wait that allowed borrowing
}

// Source is where a limit came from, as a number, so that a State,
// written for every worker on every pick, holds no pointer. The zero
// value is none (a baseline policy's).
type Source uint8

const (
	None        Source = iota
	FromConfig         // max_concurrency, learning off
	FromSlots          // the worker's reported slots, learning off
	FromDefault        // 1, learning off and nothing reported
	Learned            // adaptive
)

// String returns the source's name as /api/workers and records show it,
// "" for none.
func (s Source) String() string {
	switch s {
	case FromConfig:
		return "config"
	case FromSlots:
		return "slots"
	case FromDefault:
		return "default"
	case Learned:
		return "learned"
	}
	return ""
}

const (
	whyFixed uint8 = iota
	whyReprobe
	whyBad
	whyUnmeasured // first tokens first: no level measured worse on both counts
)

// Saturation is what a worker's fresh telemetry says of its room.
type Saturation uint8

const (
	SatNone  Saturation = iota
	SatQueue            // requests wait in the worker's own queue
	SatKV               // its KV cache is nearly full
)

// String says in words why the limit is what it is.
func (st State) String() string {
	var out string
	switch st.why {
	case whyFixed:
		out = fmt.Sprintf("fixed at %d (%s)", st.Limit, st.Source)
	case whyReprobe:
		out = fmt.Sprintf("%d: re-probing; the verdict on %d streams (p16 %.1f < floor %.1f tok/s) is %.0fs old", st.Learned, st.level, st.p, st.Floor, st.age.Seconds())
	case whyBad:
		out = fmt.Sprintf("%d: at %d streams the slowest decode %.1f tok/s (p16), under the floor %.1f", st.Learned, st.level, st.p, st.Floor)
		if st.ttftHeld > 0 {
			out += fmt.Sprintf(", and first tokens take %.0f ms there against %.0f ms held at %d", st.ttft, st.ttftHeld, st.level-1)
		}
	case whyUnmeasured:
		out = fmt.Sprintf("%d, the cap (%s): no level measured worse for both first token and decode", st.Learned, st.Source)
		if st.Floor > 0 {
			out += fmt.Sprintf(" (floor %.1f tok/s)", st.Floor)
		}
	}
	switch st.Sat {
	case SatQueue:
		out += fmt.Sprintf("; the worker queues %.0f itself: no more than in flight", st.satVal)
	case SatKV:
		out += fmt.Sprintf("; KV cache %.0f%% full: no more than in flight", 100*st.satVal)
	}
	if st.borrow > 0 {
		out += fmt.Sprintf("; borrowing +%d: the oldest queued request waited %.1fs", st.borrow, st.waited.Seconds())
	}
	if st.Prefix > 0 {
		out += fmt.Sprintf("; +1 for this request: %.0f%% of its prompt prefix is expected cached here, little to prefill", 100*st.Prefix)
	}
	return out
}
