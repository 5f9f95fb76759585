package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/limit"
)

// Prefix affinity under a backlog (docs/routing.md, Prefix-cache
// affinity). Once requests wait, each release binds the queue's head to
// the worker that freed, whoever holds its prefix. Two bounded rules keep
// the affinity, only while the prefix term has a weight and never with a
// shared Ledger (its waiting list orders binds across replicas):
//
//   - Holder first: a request waiting behind the head, within the aging
//     bound and the first affinityScan, that the head's worker is expected
//     to hold affinitySwapMargin more of goes there instead.
//   - One more stream: a request that would otherwise wait may run one
//     stream over a worker's learned limit (never its cap, nor while the
//     worker reports saturation) when the worker holds at least
//     affinityBorrowMatch of its prefix, since a cached prefix makes its
//     prefill, which stalls the running streams, cheap.
const (
	// affinitySwapMargin is how much more of its prefix (0..1) a waiting
	// request must be expected to find on a worker than the head does.
	affinitySwapMargin = 0.3
	// affinityBorrowMatch is the least share of its prefix (0..1) a
	// worker must hold for a request to run one stream over its limit.
	affinityBorrowMatch = 0.5
	// affinityScan bounds how many waiting requests behind the head are
	// looked at per bind, so a long queue costs no more than a short one.
	affinityScan = 32
	// affinityMatchBudget bounds the prefix lookups one bind makes for the
	// one-more-stream rule, so a large fleet costs no more than a small one.
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

// matchOnLocked is how much of req's prefix w is believed to hold, for a
// request outside a pick, as the Belief would say now.
func (s *Scheduler) matchOnLocked(req Request, w *worker) float64 {
	if !s.conf.affine(&req) {
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
// prefix become eligible for one stream more.
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
// limit, below its cap, with the floor known and no saturation reported.
func atLearnedLimit(v *view) bool {
	lim, active := &v.lim, v.active
	return lim.source == limit.Learned && lim.floor > 0 && lim.sat == limit.SatNone &&
		lim.limit == lim.learned && active == lim.learned && active < lim.cap
}

// affinityOvertakeLocked applies the affinity rules to q's head, whose
// pick chose headPick.w (nil: nobody). It returns the request to bind
// instead and its choice, or nil.
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
	// holder's learned limit. Only the workers the head's pick found at
	// their learned limit can be that holder: a cheap test before a pick,
	// within a budget of lookups.
	room := headPick.room
	budget := affinityMatchBudget
	for _, t := range waiting {
		if !s.conf.affine(&t.req) {
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
