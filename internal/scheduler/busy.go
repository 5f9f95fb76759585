package scheduler

import (
	"math"
	"time"
)

// busy accumulates the time integral of a worker's in-flight count, so a
// finished request can say at what mean concurrency it ran.
type busy struct {
	integral float64   // request-seconds up to at
	at       time.Time // when active last changed
}

// take adds n requests in flight (n < 0: ends them) of cost tokens to w
// at now.
func (w *worker) take(n int, cost float64, now time.Time) {
	w.busy.move(w.inFlight(), now)
	w.active += n
	w.cost += cost
	if w.active == 0 {
		w.cost = 0 // no float drift on an idle worker
	}
}

// inFlight is the worker's requests in flight across replicas.
func (w *worker) inFlight() int { return w.active + w.remote }

// move advances the integral to now at the current active count.
func (b *busy) move(active int, now time.Time) {
	if !b.at.IsZero() && now.After(b.at) {
		b.integral += float64(active) * now.Sub(b.at).Seconds()
	}
	if now.After(b.at) || b.at.IsZero() {
		b.at = now
	}
}

// MeanConcurrency returns the mean number of requests in flight on the
// lease's worker since the lease was made, this one and other replicas'
// included: the level its measurements belong to. Call it before Release.
func (l *Lease) MeanConcurrency() float64 {
	s := l.s
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.meanConcurrencyLocked(now)
}

// meanConcurrencyLocked is MeanConcurrency at now, under s.mu.
func (l *Lease) meanConcurrencyLocked(now time.Time) float64 {
	b := l.w.busy
	b.move(l.w.inFlight(), now)
	d := now.Sub(l.bound).Seconds()
	if d <= 0 {
		return float64(max(l.w.inFlight(), 1))
	}
	return math.Max(1, (b.integral-l.busyAtBind)/d)
}
