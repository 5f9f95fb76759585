package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/limit"
)

// Prefix affinity under a backlog.
//
// The prefix term alone has a say only when a request arrives to find
// workers with room: once requests wait, each release binds the head of
// the queue to the worker that freed, whoever holds its prefix, and a
// worker at its learned limit takes nobody. Measured in virtual time (see
// docs/benchmarks.md, *Prefix-cache affinity*), that is where the
// affinity was lost at 80% and 95% load. Two rules keep it there, both
// only while the prefix term has a weight, and both bounded:
//
//   - Holder first. When the head would be bound to a worker, a request
//     waiting behind it (same class, arrived no more than MaxOvertake
//     after it, among the first affinityScan) that the worker is expected
//     to hold affinitySwapMargin more of goes instead; the head takes the
//     next worker to free. That is an overtake within the aging bound the
//     queue already promises (no request is passed by one that came more
//     than MaxOvertake after it), so nobody waits long past its turn.
//   - Cheap prefill, one more stream. A request that would otherwise wait
//     may run on a worker at its learned limit (not its cap, not while the
//     worker says it is saturated, not while the backlog already lets it
//     borrow, not before the floor is known) when the worker is expected to hold at least
//     affinityBorrowMatch of its prefix. The learned limit protects the
//     decode rate of the streams already running, and what slows them most
//     is the prefill of a newcomer, which stalls every stream on the card
//     for as long as it takes; a request whose prefix is cached prefills a
//     fraction of its prompt. It is one stream over the learned limit,
//     never more, and never while a worker has room under its own limit,
//     so a hot prefix cannot pull a queue onto its holder.
//
// Neither applies with a shared Ledger: its waiting list already orders
// binds across replicas oldest first.
const (
	// affinitySwapMargin is how much more of its prefix (0..1) a waiting
	// request must be expected to find on a worker than the head does to
	// be bound there before it.
	affinitySwapMargin = 0.3
	// affinityBorrowMatch is the least share of its prefix (0..1) a
	// worker must be expected to hold for a request to run one stream over
	// that worker's learned limit.
	affinityBorrowMatch = 0.5
	// affinityScan bounds how many waiting requests behind the head are
	// looked at per bind, so a long queue costs no more than a short one.
	affinityScan = 32
	// affinityMatchBudget bounds the prefix lookups one bind makes for the
	// one-more-stream rule behind the head, so a large fleet costs no more
	// than a small one.
	affinityMatchBudget = 256
)

// affinityOn reports whether the backlog rules above apply.
func (s *Scheduler) affinityOn() bool {
	if s.cfg.PrefixIndex == nil || s.cfg.Policy != PolicySluice || s.cfg.Ledger != nil {
		return false
	}
	for _, wt := range s.terms {
		if wt.Term.Name() == (prefixMatch{}).Name() && wt.Weight != 0 {
			return true
		}
	}
	return false
}

// matchOnLocked is how much of req's prefix w is believed to hold: the
// Belief the prefix term reads, for a request outside a pick (a waiting
// one the holder-first rule looks at), from the session table and w's
// requests in flight as they are now.
func (s *Scheduler) matchOnLocked(req Request, w *worker) float64 {
	if !s.affine(&req) {
		return 0
	}
	b := beliefSrc{conf: s.conf, now: s.clock.Now()}
	if req.Session != "" && s.cfg.PrefixIndex != nil {
		b.session = s.sessions.Lookup(req.Model, req.Session, b.now)
	}
	c := [1]Candidate{{Name: w.spec.Name, Active: w.active, Snap: w.snapshot()}}
	b.set(&req, c[:], func(int) []kvSent { return w.kvSent })
	return c[0].PrefixMatch
}

// matchOn is how much of p's request the worker of p.views[i] is
// believed to hold, as the pick found it.
func (p *pick) matchOn(i int) float64 {
	if !p.conf.affine(&p.req) {
		return 0
	}
	v := &p.views[i]
	c := [1]Candidate{{Name: v.w.spec.Name, Active: v.active, Snap: v.snap}}
	p.beliefs.set(&p.req, c[:], func(int) []kvSent { return v.kvSent })
	return c[0].PrefixMatch
}

// affinityBorrow is the relaxation stage of a pick that found no worker
// with room: workers full at their learned limit that hold enough of the
// request's prefix become eligible for one stream more (see above),
// appended to p.elig.
func (p *pick) affinityBorrow() {
	for i := range p.views {
		v := &p.views[i]
		if !oneMoreRoom(v) {
			continue
		}
		m := p.matchOn(i)
		if m < affinityBorrowMatch {
			continue
		}
		v.lim.limit, v.lim.prefix = v.active+1, m
		v.why = whyEligible
		p.elig = append(p.elig, int32(i))
	}
}

// oneMoreRoom reports whether v, as its pick found it, is full at its
// learned limit and could run one stream more for a cached prefix.
func oneMoreRoom(v *view) bool {
	return v.why == whyFull && atLearnedLimit(v)
}

// atLearnedLimit reports whether v's worker runs exactly its learned
// limit, which is below its cap, with the floor known and no saturation
// reported.
func atLearnedLimit(v *view) bool {
	lim, active := &v.lim, v.active
	return lim.source == limit.Learned && lim.floor > 0 && lim.sat == limit.SatNone &&
		lim.limit == lim.learned && active == lim.learned && active < lim.cap
}

// affinityOvertakeLocked applies the holder-first rule to q's head, whose
// pick chose headPick.w (nil: nobody). It returns the request to bind
// instead, its worker and record, or nil to bind the head as planned.
func (s *Scheduler) affinityOvertakeLocked(q *queue, head *Ticket, headPick choice, now time.Time) (*Ticket, choice) {
	if !s.affinityOn() {
		return nil, choice{}
	}
	w := headPick.w
	waiting := q.Behind(&head.entry, s.order.Overtake, affinityScan)
	if len(waiting) == 0 {
		return nil, choice{}
	}
	if w != nil {
		// Someone behind the head holds much more of its prefix on w.
		headMatch := s.matchOnLocked(head.req, w)
		var best *Ticket
		bestMatch := headMatch + affinitySwapMargin
		for _, t := range waiting {
			if m := s.matchOnLocked(t.req, w); m >= bestMatch && (best == nil || m > bestMatch) {
				best, bestMatch = t, m
			}
		}
		if best == nil {
			return nil, choice{}
		}
		if c := s.pickLocked(best.req, best.entry.Arrival, now, false); c.w == w {
			explainOvertake(c.rec, head, best, holderFirst(w.spec.Name, bestMatch, headMatch))
			return best, c
		}
		return nil, choice{}
	}
	// The head waits for room; someone behind it may run one stream over a
	// holder's learned limit. Only the workers the head's pick found full
	// at their learned limit can be that holder (or too short for the
	// head's prompt but at their learned limit: a shorter one may fit): a
	// cheap test before a pick, within a budget of lookups.
	room := headPick.room
	budget := affinityMatchBudget
	for _, t := range waiting {
		if !s.affine(&t.req) {
			continue
		}
		holds := false
		for _, w := range room {
			if budget == 0 {
				return nil, choice{}
			}
			budget--
			if s.matchOnLocked(t.req, w) >= affinityBorrowMatch {
				holds = true
				break
			}
		}
		if !holds {
			continue
		}
		if c := s.pickLocked(t.req, t.entry.Arrival, now, false); c.w != nil {
			explainOvertake(c.rec, head, t, holderFirst(c.w.spec.Name, s.matchOnLocked(t.req, c.w), s.matchOnLocked(head.req, c.w)))
			return t, c
		}
	}
	return nil, choice{}
}

// holderFirst says, for the record, why a request went before the head
// by the holder-first rule.
func holderFirst(worker string, m, headMatch float64) string {
	return fmt.Sprintf("the holder-first rule: %s is expected to hold %.0f%% of this prompt's prefix against %.0f%% of that one's", worker, 100*m, 100*headMatch)
}
