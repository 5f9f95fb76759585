package scheduler

// A worker's limit at a pick and its reason in words.

import (
	"fmt"
	"time"
)

// limitState is a worker's limit at one moment, with the facts behind it;
// the reason is put in words only when a record or API is read, so the
// hot path formats nothing.
type limitState struct {
	limit   int         // in force for a new request
	learned int         // what the controller learned (limit without borrowing)
	cap     int         // the most it may ever be
	source  limitSource // where it came from
	floor   float64

	why      uint8         // one of the why* constants below
	level    int           // the level the reason is about
	n        int64         // samples at that level
	p        float64       // its pessimistic rate
	age      time.Duration // age of its verdict (re-probe)
	sat      uint8         // satQueue or satKV when telemetry capped it
	satVal   float64
	ttft     float64       // whyBad, first tokens first: the level's mean TTFT (ms)
	ttftHeld float64       // and what a request held one level below would see (ms)
	borrow   int           // streams borrowed over the learned limit
	waited   time.Duration // the queue wait that allowed borrowing
	prefix   float64       // >0: one stream over the learned limit for a request this much of whose prefix is cached (affinity.go)
}

// limitSource is where a limit came from, one of the Limit* sources as a
// number, so that a limitState, written for every worker on every pick,
// holds no pointer. The zero value is none (a baseline policy's).
type limitSource uint8

const (
	srcNone limitSource = iota
	srcConfig
	srcSlots
	srcDefault
	srcLearned
)

// String returns the source's name (LimitFromConfig, ...), "" for none.
func (s limitSource) String() string {
	switch s {
	case srcConfig:
		return LimitFromConfig
	case srcSlots:
		return LimitFromSlots
	case srcDefault:
		return LimitFromDefault
	case srcLearned:
		return LimitLearned
	}
	return ""
}

const (
	whyFixed uint8 = iota
	whyReprobe
	whyBad
	whyUnmeasured // first tokens first: no level measured worse on both counts
)

const (
	satNone uint8 = iota
	satQueue
	satKV
)

// String says in words why the limit is what it is.
func (st limitState) String() string {
	var out string
	switch st.why {
	case whyFixed:
		out = fmt.Sprintf("fixed at %d (%s)", st.limit, st.source)
	case whyReprobe:
		out = fmt.Sprintf("%d: re-probing; the verdict on %d streams (p16 %.1f < floor %.1f tok/s) is %.0fs old", st.learned, st.level, st.p, st.floor, st.age.Seconds())
	case whyBad:
		out = fmt.Sprintf("%d: at %d streams the slowest decode %.1f tok/s (p16), under the floor %.1f", st.learned, st.level, st.p, st.floor)
		if st.ttftHeld > 0 {
			out += fmt.Sprintf(", and first tokens take %.0f ms there against %.0f ms held at %d", st.ttft, st.ttftHeld, st.level-1)
		}
	case whyUnmeasured:
		out = fmt.Sprintf("%d, the cap (%s): no level measured worse for both first token and decode", st.learned, st.source)
		if st.floor > 0 {
			out += fmt.Sprintf(" (floor %.1f tok/s)", st.floor)
		}
	}
	switch st.sat {
	case satQueue:
		out += fmt.Sprintf("; the worker queues %.0f itself: no more than in flight", st.satVal)
	case satKV:
		out += fmt.Sprintf("; KV cache %.0f%% full: no more than in flight", 100*st.satVal)
	}
	if st.borrow > 0 {
		out += fmt.Sprintf("; borrowing +%d: the oldest queued request waited %.1fs", st.borrow, st.waited.Seconds())
	}
	if st.prefix > 0 {
		out += fmt.Sprintf("; +1 for this request: %.0f%% of its prompt prefix is expected cached here, little to prefill", 100*st.prefix)
	}
	return out
}
