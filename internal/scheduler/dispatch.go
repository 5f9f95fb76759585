package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// dispatchLocked binds queued requests to workers with room, each queue's
// head in its order (see queue), heads across models retries first, then
// by class, then by arrival, until no queue has a placeable request.
func (s *Scheduler) dispatchLocked() []*Ticket { return s.dispatchExceptLocked("", false) }

// dispatchExceptLocked is dispatchLocked leaving model's queue alone when
// skip is set. A model whose pick waits for the shared ledger's answer is
// left alone too; that pick is then told that it was passed over, so that
// it looks again if the ledger had no room.
func (s *Scheduler) dispatchExceptLocked(model string, skip bool) []*Ticket {
	if s.cfg.Policy != PolicySluice || len(s.queues) == 0 {
		return nil
	}
	var done []*Ticket
	now := s.clock.Now()
	type head struct {
		q *queue
		t *Ticket
	}
	heads := make([]head, 0, len(s.queues))
	var started []*reservation // asked for by this dispatch
	for {
		heads = heads[:0]
		for m, q := range s.queues {
			if skip && m == model {
				continue
			}
			if res := s.reserving[m]; res != nil {
				if !slices.Contains(started, res) {
					res.missed = true
				}
				continue
			}
			heads = append(heads, head{q, q.head(s.order)})
		}
		slices.SortFunc(heads, func(a, b head) int { return s.order.compare(a.q.keyOf(a.t), b.q.keyOf(b.t)) })
		bound := false
		for _, h := range heads {
			if t, c := s.placeableLocked(h.q, now); t != nil {
				if c.refuse {
					s.unqueueLocked(t, false)
					s.sharedGoneLocked(t)
					s.refuseLocked(t, c.rec, ErrSLOUnmeetable)
					done = append(done, t)
				} else if c.pending != nil {
					s.startReserveLocked(t, c)
					started = append(started, t.res)
				} else {
					s.unqueueLocked(t, true)
					s.bindLocked(t, c, "", now)
					done = append(done, t)
				}
				bound = true
				break
			}
		}
		if !bound {
			return done
		}
	}
}

// sweepLocked refuses the queued requests that can no longer be served:
// every worker of their model is down, draining or gone (no_healthy_worker),
// or, now that every worker's models are known, nobody serves it
// (model_not_found). It runs when the fleet changes, not on every release.
func (s *Scheduler) sweepLocked(done []*Ticket) []*Ticket {
	now := s.clock.Now()
	var gone []*Ticket
	for model, q := range s.queues {
		why, spec := s.admissibleLocked(Request{Model: model})
		if why != nil {
			q.each(func(t *Ticket) { gone = append(gone, t) })
			continue
		}
		if q.spec && !spec {
			q.spec = false
			s.sharedJoinLocked(q)
		}
		for _, t := range q.retries {
			if len(t.req.Exclude) > 0 && s.whyNotWaitLocked(t.req) != nil {
				gone = append(gone, t)
			}
		}
	}
	slices.SortFunc(gone, func(a, b *Ticket) int { return cmp.Compare(a.seq, b.seq) })
	for _, t := range gone {
		cause := s.whyNotWaitLocked(t.req)
		if errors.Is(cause, ErrUnknownModel) && !s.queues[t.req.Model].spec {
			// It was served when the request came: its workers went away.
			cause = ErrNoHealthyWorker
		}
		s.unqueueLocked(t, false)
		s.sharedGoneLocked(t)
		rec := s.refusalRecordLocked(t.req, now)
		s.refuseLocked(t, rec, cause)
		done = append(done, t)
	}
	return done
}

// placeableLocked returns the ticket of q that goes next if a worker can
// take it now. Tickets normally share one fate (same model, same eligible
// workers), so only the head is tried; a retry that excludes workers which
// failed it is skipped over, so it cannot hold back the requests behind
// it.
func (s *Scheduler) placeableLocked(q *queue, now time.Time) (*Ticket, choice) {
	for _, t := range q.retries {
		if c := s.pickLocked(t.req, t.enq, now, false); c.w != nil || c.refuse {
			return t, c
		}
		if len(t.req.Exclude) == 0 {
			return nil, choice{}
		}
	}
	if t := q.next(s.order); t != nil {
		c := s.pickLocked(t.req, t.enq, now, false)
		// A request behind the head may go first where its prefix is
		// cached, within the aging bound (see affinity.go).
		if u, uc := s.affinityOvertakeLocked(q, t, c, now); u != nil {
			return u, uc
		}
		if c.w != nil || c.refuse {
			return t, c
		}
		if c.kvHeld { // the head's prompt fits no cache now (kvfit.go)
			return s.passHeadLocked(q, t, now, fmt.Sprintf("whose prompt of ~%d tokens no eligible worker's free KV cache could take", t.req.PromptTokens))
		}
		if c.sloWait { // the head waits for a worker that keeps its promise (promise.go)
			return s.passHeadLocked(q, t, now, "that waits for a worker predicted to keep its promise")
		}
	}
	return nil, choice{}
}
