// Package limit is the per-worker concurrency-limit controller: how many
// requests Sluice lets a worker run at once when its max_concurrency is
// "auto" (the default), or below the hand-set cap when it is a number.
// Its values are plain: the scheduler computes a worker's State from an
// Input under its own lock, and keeps the Move of each worker.
// docs/routing.md (Adaptive concurrency) describes it for operators.
//
// # The controller
//
// One more stream on a busy GPU can slow every stream on it, while a
// request held in Sluice's queue pays its wait in time to first token. So
// a worker starts at its cap (its reported slots, else DefaultCap) and
// the limit is lowered only where a level (stats.Level: the averages of
// requests that ran with k in flight) is measured worse on both counts:
//
//   - a level with fewer than MinSamples samples is assumed good;
//   - level k ≥ 2 is bad when its pessimistic decode rate (mean minus one
//     standard deviation) is under the floor and its mean time to first
//     token is longer than a request held at k-1 streams would see
//     (heldTTFT);
//   - the limit is then k-1 for the lowest bad level; a bad level's
//     verdict expires after ProbeAfter without samples, so a worker that
//     recovered is tried at that level again;
//   - the worker's own telemetry caps the limit at what is in flight when
//     it says it is saturated (its own queue, or a nearly full KV cache).
//
// The limit is a pure function of measured averages, which move by a
// fraction of each sample's gap, so it cannot oscillate faster than
// samples arrive (the shape of TCP Vegas and of gradient limiters, with
// per-stream tokens/s as the target). The floor, when not set, is
// FloorFraction of the best solo decode rate among the model's workers.
//
// # Borrowing under a backlog
//
// When the oldest request waiting for a model has waited BorrowAfter or
// longer, each worker may take one more stream than its learned limit for
// every BorrowAfter waited, up to its cap: decode rate is traded for time
// to first token only while requests are actually waiting.
package limit

import (
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// Config configures the controller (see the package doc).
type Config struct {
	// Fixed turns learning off: every worker's limit is its
	// max_concurrency, else its reported slots, else 1.
	Fixed bool
	// MinStreamTokS is the per-stream decode-rate floor in tokens/s; 0
	// derives it from FloorFraction.
	MinStreamTokS float64
	// ModelFloors overrides MinStreamTokS per model.
	ModelFloors map[string]float64
	// FloorFraction is the floor as a fraction of the best solo decode
	// rate among the model's workers, when no floor is set; 0.5 when 0.
	FloorFraction float64
	// MinSamples is how many streams a level needs before it is judged; 3
	// when 0.
	MinSamples int
	// ProbeAfter is how long a bad level's verdict lasts without new
	// samples; 60s when 0.
	ProbeAfter time.Duration
	// BorrowAfter is the queue wait after which workers may exceed their
	// learned limit (one stream per BorrowAfter waited); 2s when 0.
	BorrowAfter time.Duration
	// DefaultCap bounds a worker that has neither max_concurrency nor
	// reported slots (vLLM, OpenAI-compatible servers); 64 when 0.
	DefaultCap int
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.FloorFraction <= 0 {
		c.FloorFraction = 0.5
	}
	if c.MinSamples <= 0 {
		c.MinSamples = 3
	}
	if c.ProbeAfter <= 0 {
		c.ProbeAfter = time.Minute
	}
	if c.BorrowAfter <= 0 {
		c.BorrowAfter = 2 * time.Second
	}
	if c.DefaultCap <= 0 {
		c.DefaultCap = 64
	}
	return c
}

// Cap is the most a worker may run: its max_concurrency, else its
// reported slots, else the default cap (learning) or 1 (fixed).
func (c *Config) Cap(maxConcurrency, slots int) (int, Source) {
	switch {
	case maxConcurrency > 0:
		return maxConcurrency, FromConfig
	case slots > 0:
		return slots, FromSlots
	case c.Fixed:
		return 1, FromDefault
	}
	return c.DefaultCap, FromDefault
}

// ConfiguredFloor returns the floor set for model, if one is.
func (c *Config) ConfiguredFloor(model string) (float64, bool) {
	if f, ok := c.ModelFloors[model]; ok && f > 0 {
		return f, true
	}
	if c.MinStreamTokS > 0 {
		return c.MinStreamTokS, true
	}
	return 0, false
}

// Floor returns the decode-rate floor for model: configured, or
// FloorFraction of best, the best solo rate measured among its workers
// (BestSolo; 0 when none has been measured alone yet).
func (c *Config) Floor(model string, best float64) float64 {
	if f, ok := c.ConfiguredFloor(model); ok {
		return f
	}
	return c.FloorFraction * best
}

// BestSolo returns the larger of best and ws's measured solo decode rate.
func BestSolo(best float64, ws *stats.WorkerStats) float64 {
	if l := ws.Levels.At(1); l.DecodeTPS.Known() {
		return max(best, l.DecodeTPS.Value)
	}
	return best
}

// StepIn is how long until a queue whose oldest request has waited
// waited will have waited another BorrowAfter: when workers may borrow
// one stream more.
func (c *Config) StepIn(waited time.Duration) time.Duration {
	return c.BorrowAfter - waited%c.BorrowAfter
}

// Input is what a limit is computed from: the worker's cap and its
// source, its in-flight count and stats (an immutable value), whether
// its fresh telemetry says it is saturated, the model's floor and its
// queue's wait, and the time.
type Input struct {
	Cap    int
	Source Source
	Active int
	Stats  *stats.WorkerStats
	Sat    Saturation
	SatVal float64 // the reading that says so
	Floor  float64
	Waited time.Duration
	Now    time.Time
}

// Of computes a limit from its inputs alone, so that a decision record
// can redo it from the values it kept when it is read.
func (c *Config) Of(in Input) State {
	if c.Fixed {
		return State{Limit: in.Cap, Learned: in.Cap, Cap: in.Cap, Source: in.Source, why: whyFixed}
	}
	st := State{Cap: in.Cap, Source: Learned, Floor: in.Floor}
	c.learn(&st, in.Stats, in.Now)
	st.Limit = st.Learned
	if in.Sat != SatNone && in.Active < st.Limit {
		st.Sat, st.satVal = in.Sat, in.SatVal
		st.Limit = max(in.Active, 1)
	}
	if in.Waited >= c.BorrowAfter && st.Limit < in.Cap {
		n := min(st.Limit+int(in.Waited/c.BorrowAfter), in.Cap)
		st.borrow, st.waited = n-st.Limit, in.Waited
		st.Limit = n
	}
	return st
}

// learn walks the levels from 1 upwards and sets st.Learned and why. See
// the package doc.
func (c *Config) learn(st *State, ws *stats.WorkerStats, now time.Time) {
	minN := int64(c.MinSamples)
	st.Learned = st.Cap
	if st.Floor <= 0 {
		// No floor yet (nobody measured alone): nothing can be judged.
		st.why = whyUnmeasured
		return
	}
	// A level never measured has no samples, fewer than MinSamples (at
	// least 1): the walk can stop at the last level measured.
	for k := 2; k <= min(st.Cap, ws.Levels.Len()); k++ {
		l := ws.Levels.At(k)
		n := l.DecodeTPS.N
		if n < minN {
			continue
		}
		p := l.DecodeTPS.Value - l.StdDev()
		if p >= st.Floor {
			continue
		}
		ttft, held, known := heldTTFT(ws, k)
		if !known || ttft <= held {
			continue // slow to decode, but quicker to a first token than waiting
		}
		st.level, st.n, st.p, st.ttft, st.ttftHeld = k, n, p, ttft, held
		if age := now.Sub(l.Updated); age >= c.ProbeAfter {
			st.Learned, st.why, st.age = k, whyReprobe, age
			return
		}
		st.Learned, st.why = k-1, whyBad
		return
	}
	st.why = whyUnmeasured
}

// heldTTFT returns level k's mean time to first token and what a request
// held at k-1 streams is expected to see instead (level k-1's TTFT plus
// the wait for the first of its k-1 streams to end: the worker's mean
// end-to-end time over k-1), in ms; known is false while either level's
// TTFT or the end-to-end time is unmeasured.
func heldTTFT(ws *stats.WorkerStats, k int) (ttft, held float64, known bool) {
	at, below := ws.Level(k).TTFTMs, ws.Level(k-1).TTFTMs
	if !at.Known() || !below.Known() || !ws.E2EMs.Known() {
		return 0, 0, false
	}
	return at.Value, below.Value + ws.E2EMs.Value/float64(k-1), true
}

// Move is the latest change of a worker's learned limit: when, from
// what, and the state that moved it (put in words when read).
type Move struct {
	At    time.Time
	From  int
	Known bool // a limit has been learned at all
	State State
}

// Note remembers when the learned limit in st changed and why.
func (m *Move) Note(st *State, now time.Time) {
	if st.Source != Learned {
		return
	}
	if !m.Known {
		*m = Move{At: now, From: st.Learned, Known: true, State: *st}
		return
	}
	if st.Learned != m.State.Learned {
		*m = Move{At: now, From: m.State.Learned, Known: true, State: *st}
	}
}
