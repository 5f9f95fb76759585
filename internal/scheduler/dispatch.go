package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// dispatchLocked binds queued requests to workers with room, heads across
// models in the queue order, until no queue has a placeable request.
func (s *Scheduler) dispatchLocked() []*Ticket { return s.dispatchExceptLocked("", false) }

// dispatchExceptLocked is dispatchLocked leaving model's queue alone when
// skip is set. A model whose pick waits for the ledger is left alone too,
// and its reservation marked missed, so it looks again if the ledger had
// no room.
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
			heads = append(heads, head{q, q.Head(s.order)})
		}
		slices.SortFunc(heads, func(a, b head) int { return s.order.Compare(a.q.KeyOf(&a.t.entry), b.q.KeyOf(&b.t.entry)) })
		bound := false
		for _, h := range heads {
			if t, c := s.placeableLocked(h.q, now); t != nil {
				if c.refuse {
					s.queues.unqueue(t, false)
					s.ledger.gone(t)
					s.refuseLocked(t, c.rec, ErrSLOUnmeetable)
					done = append(done, t)
				} else if c.pending != nil {
					s.startReserveLocked(t, c)
					started = append(started, t.res)
				} else {
					s.queues.unqueue(t, true)
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

// sweepLocked refuses the queued requests that can no longer be served.
// It runs when the fleet changes, not on every release.
func (s *Scheduler) sweepLocked(done []*Ticket) []*Ticket {
	now := s.clock.Now()
	var gone []*Ticket
	for model, q := range s.queues {
		why, spec := s.admissibleLocked(Request{Model: model})
		if why != nil {
			gone = slices.AppendSeq(gone, q.All())
			continue
		}
		if q.spec && !spec {
			q.spec = false
			s.ledger.join(q)
		}
		for t := range q.Retries() {
			if len(t.req.Exclude) > 0 {
				if why, _ := s.admissibleLocked(t.req); why != nil {
					gone = append(gone, t)
				}
			}
		}
	}
	slices.SortFunc(gone, func(a, b *Ticket) int { return cmp.Compare(a.entry.Seq, b.entry.Seq) })
	for _, t := range gone {
		cause, _ := s.admissibleLocked(t.req)
		if errors.Is(cause, ErrUnknownModel) && !s.queues[t.req.Model].spec {
			// It was served when the request came: its workers went away.
			cause = ErrNoHealthyWorker
		}
		s.queues.unqueue(t, false)
		s.ledger.gone(t)
		rec := s.refusalRecordLocked(t.req, now)
		s.refuseLocked(t, rec, cause)
		done = append(done, t)
	}
	return done
}

// placeableLocked returns the ticket of q that goes next if a worker can
// take it now: the queue's next, or one that overtakes it. A retry that
// excludes the workers which failed it is skipped over, so it cannot hold
// back the requests behind it.
func (s *Scheduler) placeableLocked(q *queue, now time.Time) (*Ticket, choice) {
	for t := range q.Retries() {
		if c := s.pickLocked(t.req, t.entry.Arrival, now, false); c.w != nil || c.refuse {
			return t, c
		}
		if len(t.req.Exclude) == 0 {
			return nil, choice{}
		}
	}
	head := q.Next(s.order)
	if head == nil {
		return nil, choice{}
	}
	c := s.pickLocked(head.req, head.entry.Arrival, now, false)
	ok, why := c.placeable()
	if u, uc := s.overtakeLocked(q, head, c, ok, why, now); u != nil {
		return u, uc
	}
	if ok {
		return head, c
	}
	return nil, choice{}
}

// hold names the placement rule that keeps a request from being placed
// while others behind it could be.
type hold uint8

const (
	// holdNone: it can be placed, or waits for room as all its model does.
	holdNone hold = iota
	// holdKVFit: its prompt fits no eligible worker's KV cache (kvfit.go).
	holdKVFit
	// holdPromise: it waits for a worker that keeps its promise (promise.go).
	holdPromise
)

// placeable reports whether a queued request's pick can be placed now (a
// worker chosen, or a refusal), and when not, which rule holds it.
func (c *choice) placeable() (ok bool, why hold) {
	switch {
	case c.w != nil || c.refuse:
		return true, holdNone
	case c.kvHeld:
		return false, holdKVFit
	case c.sloWait:
		return false, holdPromise
	}
	return false, holdNone
}

// overtakeLocked is the one way a request is placed before q's head: by
// the affinity rules (affinity.go), or, when a rule holds the head (why),
// the first request behind it within the aging bound that can be placed.
// Not with a shared ledger, whose picks answer later. nil when nobody
// overtakes.
func (s *Scheduler) overtakeLocked(q *queue, head *Ticket, c choice, ok bool, why hold, now time.Time) (*Ticket, choice) {
	if u, uc := s.affinityOvertakeLocked(q, head, c, now); u != nil {
		return u, uc
	}
	if ok || why == holdNone || s.cfg.Ledger != nil {
		return nil, choice{}
	}
	for _, t := range q.Behind(&head.entry, s.order.Overtake, affinityScan) {
		if tc := s.pickLocked(t.req, t.entry.Arrival, now, false); tc.w != nil {
			explainOvertake(tc.rec, head, t, why.explain(head))
			return t, tc
		}
	}
	return nil, choice{}
}

// explain says, for the record of a request that went before head, why
// head was held.
func (why hold) explain(head *Ticket) string {
	if why == holdKVFit {
		return fmt.Sprintf("the KV-fit rule held it: its prompt of ~%d tokens fit no eligible worker's free KV cache", head.req.PromptTokens)
	}
	return "the promise rule held it: it waits for a worker predicted to keep its promise"
}

// explainOvertake has rec say that its request was bound before the
// older head, and why.
func explainOvertake(rec *decisions.Record, head, t *Ticket, why string) {
	if rec == nil {
		return
	}
	longer := t.entry.Arrival.Sub(head.entry.Arrival).Seconds()
	rec.AddExplain(func(r *decisions.Record) {
		r.Reason += fmt.Sprintf("; bound before an older waiting request (it has waited %.1fs longer): %s", longer, why)
	})
}
