package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// Late requests yield (Config.YieldLate). Under a backlog the queue's
// arrival order makes everyone wait alike: once the wait is longer than
// the first-token objective, every request misses its promise, the ones
// that could still keep it included. With YieldLate a request that can
// no longer get its first token within its objective — its wait so far
// plus its prompt's prefill on the fastest unloaded worker of its model
// is past the objective of its SLO (sloOfLocked) — lets the oldest
// request behind it that still can go first. It is served afterwards,
// not refused, and the aging bound holds: it is never passed by a
// request that arrived more than Config.MaxOvertake after it.
//
// It keeps more promises under overload, and lengthens the wait of the
// requests that had already missed: the p99 of time to first token. It
// is off by default because of that p99 (docs/benchmarks.md, Late
// requests yield).

// lateOvertakeLocked returns the request to bind in head's place when
// head can no longer keep its first-token objective: the oldest request
// behind it, within the aging bound, that still can. It returns nil to
// keep the order: the stage is off, head is a retry or on time, a shared
// ledger orders the fleet's queue, or everyone within the bound is late
// too.
func (s *Scheduler) lateOvertakeLocked(q *queue, head *Ticket, now time.Time) *Ticket {
	if !s.cfg.YieldLate || head.front || s.cfg.Ledger != nil || !s.lateLocked(head, now) {
		return nil
	}
	waiting := q.behind(s.behindBuf[:0], head, s.order.overtake)
	s.behindBuf = waiting[:0]
	defer clear(waiting)
	for _, t := range waiting {
		if !s.lateLocked(t, now) {
			return t
		}
	}
	return nil
}

// lateLocked reports whether t, bound now, is expected to miss its
// first-token objective even on the fastest idle worker of its model.
func (s *Scheduler) lateLocked(t *Ticket, now time.Time) bool {
	obj := s.sloOfLocked(&t.req, now).Deadline(t.req.PromptTokens, 0)
	if obj <= 0 {
		return false // no first-token objective: never late
	}
	prefill := time.Duration(float64(s.derivedLocked(t.req.Model, now).prefillPer1k) * float64(t.req.PromptTokens) / 1000)
	return now.Sub(t.enq)+prefill > obj
}

// explainLate notes in the record of a request bound before a late one
// why it went first.
func explainLate(rec *decisions.Record, late *Ticket, bound *Ticket) {
	if rec == nil {
		return
	}
	longer := bound.enq.Sub(late.enq).Seconds()
	rec.AddExplain(func(r *decisions.Record) {
		r.Reason += fmt.Sprintf("; bound before an older waiting request (it has waited %.1fs longer) already past its first-token objective (admission.yield_late)", longer)
	})
}
