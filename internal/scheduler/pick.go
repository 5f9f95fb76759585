package scheduler

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/stats"
)

// pickLocked chooses the worker for req without reserving it, and returns
// the decision record explaining the choice. When no worker is eligible it
// returns no record unless always is set (a refusal needs one): under a
// backlog every arrival and release asks, and most answers are "nobody",
// which must cost no allocation.
func (s *Scheduler) pickLocked(req Request, now time.Time, always bool) (*worker, *decisions.Record) {
	s.shared.binding = !always // a refusal's record reserves nothing
	elig := s.eligBuf[:0]
	idx := s.idxBuf[:0] // configuration index of each eligible worker
	baseline := s.cfg.Policy != PolicySluice
	learning := !baseline && !s.limits.Fixed
	// Each worker's telemetry and stats are resolved once for the whole
	// pick: the floor, the limit and the score all read them.
	best := 0.0 // the best solo decode rate among the model's workers
	for _, w := range s.workers {
		w.snap, w.st = w.snapshot(), s.statsOf(w)
		w.serving = w.serves(w.snap, req.Model)
		if learning && w.serving {
			best = bestSolo(best, w.st)
		}
	}
	var floor float64
	var waited time.Duration
	if learning {
		var ok bool
		if floor, ok = s.configuredFloor(req.Model); !ok {
			floor = s.limits.FloorFraction * best
		}
		waited = s.oldestWaitLocked(req.Model, now)
	}
	// The eligible workers' candidates, and with records every worker's
	// slot, are written in the same pass, while the worker is in cache.
	slots, refs := s.pickSlotsLocked()
	prefixOn := s.prefixWeighted && len(req.Prefix) > 0 && !baseline // as prefixMatchLocked tests
	// An index that answers for all candidates at once is asked once
	// they are all known.
	batch, _ := s.cfg.PrefixIndex.(prefixBatcher)
	prefixEach := prefixOn && batch == nil
	cands := s.candBuf[:0]
	if cap(cands) < len(s.workers) {
		cands = make([]Candidate, 0, len(s.workers))
	}
	for i, w := range s.workers {
		snap := w.snap
		why := whyEligible
		if !baseline {
			s.limitInto(&w.lim, w, snap, w.st, floor, waited, now)
			w.pickLimit = w.lim.limit
			w.noteLimitLocked(&w.lim, now)
		} else {
			w.lim = limitState{}
		}
		switch {
		case w.draining:
			why = whyDraining
		case snap.Health == HealthDown:
			why = whyDown
		case snap.Health == HealthLoading:
			why = whyLoading
		case !w.serving:
			why = whyModel
		case len(req.Exclude) > 0 && slices.Contains(req.Exclude, w.spec.Name):
			why = whyExcluded
		case snap.ContextTokens > 0 && req.PromptTokens > snap.ContextTokens: // tooLong
			why = whyContext
		case !baseline && w.active >= w.lim.limit:
			why = whyFull
		default:
			elig = append(elig, w)
			idx = append(idx, i)
			cands = s.appendCandLocked(&req, cands, w, prefixEach)
		}
		w.why = why
		if slots != nil {
			// Field by field, every one: a struct literal would be copied
			// in with a bulk write barrier, slow while the GC runs, and
			// the slots are the previous pick's.
			ref, sl := &refs[i], &slots[i]
			ref.name, ref.snap, ref.st = w.spec.Name, snap, w.st
			sl.prefix, sl.lastPick, sl.limit, sl.cap = w.lim.prefix, w.lastPick, w.lim.limit, w.lim.cap
			sl.active, sl.why, sl.source = int32(w.active), why, w.lim.source
			sl.jobCost, sl.prefixMatch, sl.total, sl.scored, sl.prefixSrc = 0, 0, 0, 0, 0
		}
	}
	if len(elig) == 0 && !baseline && !s.limits.Fixed && len(req.Prefix) > 0 && s.affinityOn() {
		elig, idx = s.affinityBorrowLocked(req, elig, idx)
		for j, w := range elig {
			cands = s.appendCandLocked(&req, cands, w, prefixEach)
			if slots != nil {
				sl := &slots[idx[j]]
				sl.why, sl.limit, sl.prefix = w.why, w.lim.limit, w.lim.prefix
			}
		}
	}
	if prefixOn && batch != nil && len(cands) > 0 {
		s.prefixMatchesLocked(&req, cands, batch)
	}
	s.kvHeld = false
	if !baseline && s.cfg.KVFit {
		elig, idx, cands = s.kvFitLocked(&req, elig, idx, cands, slots, now)
	}
	s.eligBuf, s.idxBuf, s.candBuf = elig[:0], idx[:0], cands[:0]
	if len(elig) == 0 && (!always || s.cfg.NoRecords) {
		return nil, nil // the slots stay in s.scratch for the next pick
	}
	if s.cfg.NoRecords {
		return s.chooseLocked(nil, &req, cands, idx, elig, now), nil
	}
	pr := s.newPickRecordLocked(req, now, floor, waited)
	rec := &pr.rec
	var w *worker
	if len(elig) == 0 {
		rec.Reason = "no eligible worker"
	} else {
		w = s.chooseLocked(pr, &req, cands, idx, elig, now)
	}
	pr.keepLocked(s, slots, refs, cands, idx)
	rec.SetExplain(pr.explain)
	return w, rec
}

// appendCandLocked appends eligible w's candidate to cands, which has
// room for it, with its prefix match for req when prefixOn.
func (s *Scheduler) appendCandLocked(req *Request, cands []Candidate, w *worker, prefixOn bool) []Candidate {
	cands = cands[:len(cands)+1]
	// Field by field, every one, over the previous pick's: a struct
	// literal (or a zeroed append) is copied in with a bulk write barrier.
	c := &cands[len(cands)-1]
	c.Name, c.Active, c.JobCost, c.Snap, c.Stats = w.spec.Name, w.active, w.cost, w.snap, w.st
	c.PrefixMatch, c.PrefixSource = 0, ""
	if prefixOn {
		s.prefixMatchLocked(req, c)
	}
	return cands
}

// chooseLocked applies the policy to the eligible workers and returns the
// chosen one, filling pr (when not nil) with the choice and its reason.
func (s *Scheduler) chooseLocked(pr *pickRecord, req *Request, cands []Candidate, idx []int, elig []*worker, now time.Time) *worker {
	var reason string
	var best int
	switch s.cfg.Policy {
	case PolicySluice:
		best = s.scoreLocked(pr, req, cands, elig, now)
		if res := s.shared.pending; res != nil {
			res.slotIdx = slices.Clone(idx[:len(cands)])
		}
	case PolicyRoundRobin:
		best = int(s.rr % uint64(len(elig)))
		s.rr++
		reason = "round-robin"
	case PolicyLeastConnections:
		best = 0
		for i, w := range elig {
			if w.active < elig[best].active || (w.active == elig[best].active && w.lastPick < elig[best].lastPick) {
				best = i
			}
		}
		if pr != nil {
			reason = fmt.Sprintf("fewest active requests (%d), least recently picked among ties", elig[best].active)
		}
	case PolicyRandom:
		best = s.rng.IntN(len(elig))
		reason = "random"
	case PolicyPowerOfTwo:
		a, b := s.rng.IntN(len(elig)), s.rng.IntN(len(elig))
		if len(elig) > 1 {
			for b == a {
				b = s.rng.IntN(len(elig))
			}
		}
		best = a
		if elig[b].active < elig[a].active {
			best = b
		}
		if pr != nil {
			reason = fmt.Sprintf("fewer active of two random (%s, %s)", elig[a].spec.Name, elig[b].spec.Name)
		}
	}
	w := elig[best]
	if pr == nil {
		return w
	}
	pr.rec.Chosen = w.spec.Name
	pr.chosen = idx[best]
	if s.cfg.Policy != PolicySluice {
		pr.rec.Reason = reason
	}
	return w
}

// Why a worker was not eligible, as recorded during the pick; put in words
// when a record is built.
const (
	whyEligible uint8 = iota
	whyDraining
	whyDown
	whyLoading
	whyModel
	whyExcluded
	whyContext
	whyFull
	whyKVFit // eligible, passed over by the KV-fit rule (kvfit.go)
)

// scoreLocked scores the eligible candidates and returns the index of the
// winner: lowest total, then least recently picked, then first in
// configuration order (with a Ledger, the local choice to hold while the
// ledger chooses: s.shared.pending). The totals are left in s.scratch for pr (when not nil) to keep;
// ranks, the per-term breakdown and the reason in words are computed when
// the record is read (pickRecord.explain).
func (s *Scheduler) scoreLocked(pr *pickRecord, req *Request, cands []Candidate, elig []*worker, now time.Time) int {
	// The terms see the request through the scratch space: an Env on the
	// stack would escape through the Term interface, and the request with it.
	sc := &s.scratch
	sc.req = *req
	sc.env = Env{Now: now, StaleAfter: s.cfg.StaleAfter, Req: &sc.req}
	tot := totals(s.terms, &sc.env, cands, sc)
	best := 0
	bk := rankKey{tot[0], elig[0].lastPick, elig[0].order}
	for i := 1; i < len(cands); i++ { // one pass: only the winner is needed now
		if k := (rankKey{tot[i], elig[i].lastPick, elig[i].order}); k.less(bk) {
			best, bk = i, k
		}
	}
	if s.ledger != nil && s.shared.binding {
		// The ledger chooses, outside the lock; best is held meanwhile.
		s.pendingSharedLocked(pr, cands, tot, elig)
	}
	if pr != nil {
		pr.scored = true
		pr.pending = s.shared.pending != nil
	}
	return best
}

// rankKey orders candidates: lowest total, then least recently picked,
// then first in configuration order. No two workers share a key, so the
// order is total and the pick deterministic.
type rankKey struct {
	total    float64
	lastPick uint64
	order    int
}

func (k rankKey) less(o rankKey) bool {
	switch {
	case k.total != o.total:
		return k.total < o.total
	case k.lastPick != o.lastPick:
		return k.lastPick < o.lastPick
	}
	return k.order < o.order
}

// noStats stands in for a worker without measured history.
var noStats stats.WorkerStats

// statsOf returns w's measured averages (&noStats when none). Call it
// under the lock: a *stats.Tracker is read through w's handle.
func (s *Scheduler) statsOf(w *worker) *stats.WorkerStats {
	var st *stats.WorkerStats
	switch {
	case s.statsVia != nil:
		st = s.statsVia.StatsVia(&w.statsAt, w.spec.Name)
	case s.cfg.Stats != nil:
		st = s.cfg.Stats.Stats(w.spec.Name)
	}
	if st != nil {
		return st
	}
	return &noStats
}

// statsVia is a StatsReader that reads a worker's stats through a handle
// kept on the worker, without a map lookup per pick (*stats.Tracker).
type statsVia interface {
	StatsVia(h *stats.Handle, worker string) *stats.WorkerStats
}
