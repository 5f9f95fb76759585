package scheduler

import (
	"time"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// floorFor returns the decode-rate floor for model: configured, or
// derived from the best solo rate measured among its workers.
func (s *Scheduler) floorFor(model string) float64 {
	if f, ok := s.limits.ConfiguredFloor(model); ok {
		return f
	}
	best := 0.0
	for _, w := range s.workers {
		if w.serves(w.snapshot(), model) {
			best = limit.BestSolo(best, s.measured.of(w))
		}
	}
	return s.limits.Floor(model, best)
}

// limitOf computes w's limit (package limit) for a request of a model
// with that floor and queue wait; snap and ws are w's telemetry and stats.
func (w *worker) limitOf(lc *limit.Config, snap *snapshot.Snapshot, ws *stats.WorkerStats, floor float64, waited time.Duration, env *Env) limit.State {
	capN, src := lc.Cap(w.spec.MaxConcurrency, snap.Slots)
	in := limit.Input{Cap: capN, Source: src, Active: w.active, Stats: ws, Floor: floor, Waited: waited, Now: env.Now}
	in.Sat, in.SatVal = saturated(snap, env.Now, env.StaleAfter)
	return lc.Of(in)
}

// saturated reports a fresh reading that says the worker cannot take more:
// requests waiting in its own queue, or a KV cache nearly full.
func saturated(snap *snapshot.Snapshot, now time.Time, staleAfter time.Duration) (limit.Saturation, float64) {
	switch {
	case snap.QueueLen.Value >= 1 && fresh(&snap.QueueLen, now, staleAfter):
		return limit.SatQueue, snap.QueueLen.Value
	case snap.KVPressure.Value >= 0.95 && fresh(&snap.KVPressure, now, staleAfter):
		return limit.SatKV, snap.KVPressure.Value
	}
	return limit.SatNone, 0
}

// fresh reports whether r was read, and no longer than staleAfter ago.
func fresh(r *snapshot.Reading, now time.Time, staleAfter time.Duration) bool {
	return r.Known() && (staleAfter <= 0 || now.Sub(r.At) <= staleAfter)
}
