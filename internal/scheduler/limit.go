package scheduler

import (
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// LimitConfig configures adaptive per-worker concurrency: how many
// requests Sluice lets a worker run at once when its max_concurrency is
// "auto" (the default), or below the hand-set cap when it is a number.
//
// # The controller
//
// A GPU does not degrade gracefully: one more stream on a busy card can
// slow every stream on it. So the limit is learned per worker from what
// its streams achieved at each concurrency level (stats.Level: the moving
// averages of per-stream decode rate, its spread, and time to first token
// of requests that ran with k in flight on the worker), against a floor,
// the per-stream decode rate every stream should keep.
//
// Holding a request in Sluice's queue costs it its wait for a free stream;
// admitting it costs the streams beside it some decode rate. On traffic of
// long prompts each prefill stalls its neighbours, so a floor on decode
// rates alone would settle on one or two streams per card and make every
// request wait for its first token. So a worker starts at its cap (its
// reported slots, else DefaultCap) and the limit is lowered only where a
// level is measured worse on both counts:
//
//   - a level with fewer than MinSamples samples is assumed good;
//   - level k ≥ 2 is bad when its pessimistic decode rate (mean minus one
//     standard deviation, about the 16th percentile) is under the floor
//     and its mean time to first token is longer than a request held at
//     k-1 streams would see: level k-1's time to first token plus the
//     wait for one of its k-1 streams to end, the worker's mean
//     end-to-end time over k-1;
//   - the limit is then k-1 for the lowest bad level; a bad level's
//     verdict expires after ProbeAfter without samples, so a worker that
//     recovered is tried at that level again;
//   - the worker's own telemetry caps the limit at what is in flight when
//     it says it is saturated: requests waiting in its own queue, or its
//     KV cache nearly full.
//
// The limit is a pure function of measured averages, so it moves only
// when the measurements do, and the averages move by a fraction of each
// sample's gap: it cannot oscillate faster than samples arrive. This is
// the shape of TCP Vegas and of gradient limiters (Netflix
// concurrency-limits, Envoy's adaptive concurrency), with the target here
// the user's promise, per-stream tokens/s, rather than a latency ratio.
//
// The floor, when not set, is FloorFraction of the best solo decode rate
// (level 1) measured among the workers of the model, so a fleet is judged
// against its own fastest card without hand tuning.
//
// # Borrowing under a backlog
//
// When the oldest request waiting for a model has waited BorrowAfter or
// longer, each worker may take one more stream than its learned limit
// for every BorrowAfter waited, up to its cap: the fleet trades some
// decode rate for time to first token only while requests are actually
// waiting, and the decision record says so.
type LimitConfig struct {
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

func (c LimitConfig) withDefaults() LimitConfig {
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

// Limit sources, as /api/workers and records name them.
const (
	LimitFromConfig  = "config"  // max_concurrency, learning off
	LimitFromSlots   = "slots"   // the worker's reported slots, learning off
	LimitFromDefault = "default" // 1, learning off and nothing reported
	LimitLearned     = "learned" // adaptive
)

// capOf is the most a worker may run: its max_concurrency, else its
// reported slots, else the default cap (learning) or 1 (fixed).
func (s *Scheduler) capOf(w *worker, snap *Snapshot) (int, limitSource) {
	switch {
	case w.spec.MaxConcurrency > 0:
		return w.spec.MaxConcurrency, srcConfig
	case snap.Slots > 0:
		return snap.Slots, srcSlots
	case s.limits.Fixed:
		return 1, srcDefault
	}
	return s.limits.DefaultCap, srcDefault
}

// floorFor returns the decode-rate floor for model: configured, or
// FloorFraction of the best solo rate measured among its workers (0 when
// none has been measured alone yet).
func (s *Scheduler) floorFor(model string) float64 {
	if f, ok := s.configuredFloor(model); ok {
		return f
	}
	best := 0.0
	for _, w := range s.workers {
		if w.serves(w.snapshot(), model) {
			best = bestSolo(best, s.statsOf(w))
		}
	}
	return s.limits.FloorFraction * best
}

// configuredFloor returns the floor set for model, if one is.
func (s *Scheduler) configuredFloor(model string) (float64, bool) {
	if f, ok := s.limits.ModelFloors[model]; ok && f > 0 {
		return f, true
	}
	if s.limits.MinStreamTokS > 0 {
		return s.limits.MinStreamTokS, true
	}
	return 0, false
}

// bestSolo returns the larger of best and ws's measured solo decode rate.
func bestSolo(best float64, ws *stats.WorkerStats) float64 {
	if l := ws.Levels.At(1); l.DecodeTPS.Known() {
		return max(best, l.DecodeTPS.Value)
	}
	return best
}

// limitLocked computes w's limit for a request of a model whose floor is
// floor, given how long that model's oldest queued request has waited; ws
// is w's stats.
func (s *Scheduler) limitLocked(w *worker, snap *Snapshot, ws *stats.WorkerStats, floor float64, waited time.Duration, now time.Time) limitState {
	capN, src := s.capOf(w, snap)
	return s.limits.limitOf(limitInput{cap: capN, source: src, active: w.active, ws: ws, snap: snap,
		floor: floor, waited: waited, now: now, staleAfter: s.cfg.StaleAfter})
}

// limitInput is what a limit is computed from: the worker's cap and its
// source, its in-flight count, stats and telemetry (both immutable
// values), the model's floor and its queue's wait, the time and how old a
// reading may be.
type limitInput struct {
	cap        int
	source     limitSource
	active     int
	ws         *stats.WorkerStats
	snap       *Snapshot
	floor      float64
	waited     time.Duration
	now        time.Time
	staleAfter time.Duration
}

// limitOf computes a limit from its inputs alone, so that a decision
// record can redo it from the values it kept when it is read.
func (c *LimitConfig) limitOf(in limitInput) limitState {
	if c.Fixed {
		return limitState{limit: in.cap, learned: in.cap, cap: in.cap, source: in.source, why: whyFixed}
	}
	st := limitState{cap: in.cap, source: srcLearned, floor: in.floor}
	c.learn(&st, in.ws, in.now)
	st.limit = st.learned
	if kind, v := saturated(in.snap, in.now, in.staleAfter); kind != satNone && in.active < st.limit {
		st.sat, st.satVal = kind, v
		st.limit = max(in.active, 1)
	}
	if in.waited >= c.BorrowAfter && st.limit < in.cap {
		n := min(st.limit+int(in.waited/c.BorrowAfter), in.cap)
		st.borrow, st.waited = n-st.limit, in.waited
		st.limit = n
	}
	return st
}

// learn walks the levels from 1 upwards and sets st.learned and why. See
// LimitConfig.
func (c *LimitConfig) learn(st *limitState, ws *stats.WorkerStats, now time.Time) {
	minN := int64(c.MinSamples)
	st.learned = st.cap
	if st.floor <= 0 {
		// No floor yet (nobody measured alone): nothing can be judged.
		st.why = whyUnmeasured
		return
	}
	// A level never measured has no samples, fewer than MinSamples (at
	// least 1): the walk can stop at the last level measured.
	for k := 2; k <= min(st.cap, ws.Levels.Len()); k++ {
		l := ws.Levels.At(k)
		n := l.DecodeTPS.N
		if n < minN {
			continue
		}
		p := l.DecodeTPS.Value - l.StdDev()
		if p >= st.floor {
			continue
		}
		ttft, held, known := heldTTFT(ws, k)
		if !known || ttft <= held {
			continue // slow to decode, but quicker to a first token than waiting
		}
		st.level, st.n, st.p, st.ttft, st.ttftHeld = k, n, p, ttft, held
		if age := now.Sub(l.Updated); age >= c.ProbeAfter {
			st.learned, st.why, st.age = k, whyReprobe, age
			return
		}
		st.learned, st.why = k-1, whyBad
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

// limitMove is one change of a worker's learned limit: when, from what,
// and the state that moved it (put in words when read).
type limitMove struct {
	at    time.Time
	from  int
	known bool // a limit has been learned at all
	state limitState
}

// noteLimitLocked remembers when the learned limit of w changed and why.
func (w *worker) noteLimitLocked(st *limitState, now time.Time) {
	if st.source != srcLearned {
		return
	}
	if !w.moved.known {
		w.moved = limitMove{at: now, from: st.learned, known: true, state: *st}
		return
	}
	if st.learned != w.moved.state.learned {
		w.moved = limitMove{at: now, from: w.moved.state.learned, known: true, state: *st}
	}
}

// saturated reports a fresh reading that says the worker cannot take more
// than it runs: requests waiting in its own queue, or a KV cache nearly
// full.
func saturated(snap *Snapshot, now time.Time, staleAfter time.Duration) (uint8, float64) {
	switch {
	case snap.QueueLen.Value >= 1 && fresh(&snap.QueueLen, now, staleAfter):
		return satQueue, snap.QueueLen.Value
	case snap.KVPressure.Value >= 0.95 && fresh(&snap.KVPressure, now, staleAfter):
		return satKV, snap.KVPressure.Value
	}
	return satNone, 0
}

// fresh reports whether r was read, and no longer than staleAfter ago.
func fresh(r *Reading, now time.Time, staleAfter time.Duration) bool {
	return r.Known() && (staleAfter <= 0 || now.Sub(r.At) <= staleAfter)
}

// oldestWait is how long the oldest request queued in q has waited; 0
// when none waits (q nil).
func (q *queue) oldestWait(now time.Time) time.Duration {
	if q == nil {
		return 0
	}
	var oldest time.Time
	older := func(t *Ticket) {
		if t != nil && (oldest.IsZero() || t.enq.Before(oldest)) {
			oldest = t.enq
		}
	}
	for _, t := range q.retries {
		older(t)
	}
	for i := range q.classes {
		if q.classes[i].n > 0 {
			older(q.classes[i].oldest())
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return now.Sub(oldest)
}
