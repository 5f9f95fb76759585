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
		case slices.Contains(req.Exclude, w.spec.Name):
			why = whyExcluded
		case tooLong(snap, req):
			why = whyContext
		case !baseline && w.active >= w.lim.limit:
			why = whyFull
		default:
			elig = append(elig, w)
			idx = append(idx, i)
		}
		w.why = why
	}
	if len(elig) == 0 && !baseline && !s.limits.Fixed && len(req.Prefix) > 0 && s.affinityOn() {
		elig, idx = s.affinityBorrowLocked(req, elig, idx)
	}
	s.eligBuf, s.idxBuf = elig[:0], idx[:0]
	if len(elig) == 0 && (!always || s.cfg.NoRecords) {
		return nil, nil
	}
	if s.cfg.NoRecords {
		cands := s.candBuf[:0]
		for _, w := range elig {
			cands = append(cands, Candidate{Name: w.spec.Name, Active: w.active, JobCost: w.cost, Snap: w.snap, Stats: w.st})
			s.prefixMatchLocked(req, &cands[len(cands)-1])
		}
		s.candBuf = cands[:0]
		return s.chooseLocked(nil, &req, cands, idx, elig, nil, now), nil
	}
	rec := s.newRecordLocked(req, now)
	rec.Candidates = make([]decisions.Candidate, len(s.workers))
	// What the record keeps to explain itself (see keptWorker).
	var kept []keptWorker
	var off []keptOff
	if !baseline {
		kept = make([]keptWorker, len(s.workers))
		if learning && len(elig) < len(s.workers) {
			off = make([]keptOff, 0, len(s.workers)-len(elig))
		}
	}
	modelWhy := ""
	for i, w := range s.workers {
		snap := w.snap
		if kept != nil {
			kept[i] = keptWorker{lastPick: w.lastPick, order: w.order, cap: w.lim.cap, active: w.active, prefix: w.lim.prefix}
			if off != nil && w.why != whyEligible {
				off = append(off, keptOff{snap, w.st})
			}
		}
		c := &rec.Candidates[i]
		c.Worker, c.Active, c.Limit, c.Eligible = w.spec.Name, w.active, w.lim.limit, w.why == whyEligible
		c.LimitSource = w.lim.source.String()
		switch w.why {
		case whyDraining:
			c.Why = "draining"
		case whyDown:
			c.Why = "unhealthy: " + snap.HealthReason
		case whyLoading:
			c.Why = "loading model"
		case whyModel:
			if modelWhy == "" {
				modelWhy = fmt.Sprintf("does not serve model %q", req.Model)
			}
			c.Why = modelWhy
		case whyExcluded:
			c.Why = "already failed this request"
		case whyContext:
			c.Why = fmt.Sprintf("prompt of about %d tokens exceeds its context of %d", req.PromptTokens, snap.ContextTokens)
		}
		// whyFull is put in words from Active and Limit when the record
		// is read (see explainFull).
	}
	if len(elig) == 0 {
		rec.Reason = "no eligible worker"
		rec.SetExplain(explainFull)
		s.explainLimitsLater(rec, nil, kept, off, floor, waited, now)
		return nil, rec
	}
	cands := make([]Candidate, len(elig)) // the record's own, for explain
	for i, w := range elig {
		cands[i] = Candidate{Name: w.spec.Name, Active: w.active, JobCost: w.cost, Snap: w.snap, Stats: w.st}
		s.prefixMatchLocked(req, &cands[i])
	}
	w := s.chooseLocked(rec, &req, cands, idx, elig, kept, now)
	s.explainLimitsLater(rec, cands, kept, off, floor, waited, now)
	return w, rec
}

// keptWorker is what a record keeps of each worker, besides the eligible
// candidates as scored, to build its explanation when read: its rank key
// and what its limit is recomputed from (limitOf) with its snapshot and
// stats, which for a worker not eligible are in a keptOff (all values of
// decision time: snapshots and stats are immutable). It holds no pointer,
// so the GC need not scan it.
type keptWorker struct {
	lastPick uint64
	order    int
	cap      int
	active   int     // this replica's in-flight count, which the limit saw
	prefix   float64 // limitState.prefix: one more stream for a cached prefix
}

// keptOff is the snapshot and stats of a worker that was not eligible,
// kept while limits are learned (to explain them).
type keptOff struct {
	snap *Snapshot
	st   *stats.WorkerStats
}

// explainLimitsLater has rec say, when read, why each worker's limit was
// what it was; the words are built from values kept now.
// cands are the eligible candidates (their snapshots and stats), off the
// others'.
func (s *Scheduler) explainLimitsLater(rec *decisions.Record, cands []Candidate, kept []keptWorker, off []keptOff, floor float64, waited time.Duration, now time.Time) {
	if s.cfg.Policy != PolicySluice || s.limits.Fixed {
		return // a fixed limit's source, already in the record, says it all
	}
	lc, staleAfter := s.limits, s.cfg.StaleAfter
	rec.AddExplain(func(r *decisions.Record) {
		nextCand, nextOff := 0, 0
		for i := range r.Candidates {
			c, f := &r.Candidates[i], &kept[i]
			var of keptOff
			if c.Eligible {
				of = keptOff{cands[nextCand].Snap, cands[nextCand].Stats}
				nextCand++
			} else {
				of = off[nextOff]
				nextOff++
			}
			var st limitState
			lc.limitOf(&st, staleAfter, f.cap, srcLearned, f.active, of.st, of.snap, floor, waited, now)
			if f.prefix > 0 { // made one stream over by affinityBorrowLocked
				st.limit, st.prefix = f.active+1, f.prefix
			}
			c.LimitReason = st.String()
		}
	})
}

// chooseLocked applies the policy to the eligible workers and returns the
// chosen one, filling rec (when not nil) with the choice and its reason.
//
// kept, with rec, is the record's: scoring keeps there what it needs to
// explain itself.
func (s *Scheduler) chooseLocked(rec *decisions.Record, req *Request, cands []Candidate, idx []int, elig []*worker, kept []keptWorker, now time.Time) *worker {
	var reason string
	var best int
	switch s.cfg.Policy {
	case PolicySluice:
		if best = s.scoreLocked(rec, req, cands, idx, elig, kept, now); best < 0 {
			return nil // the shared ledger has no room for it now
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
		if rec != nil {
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
		if rec != nil {
			reason = fmt.Sprintf("fewer active of two random (%s, %s)", elig[a].spec.Name, elig[b].spec.Name)
		}
	}
	w := elig[best]
	if rec == nil {
		return w
	}
	rec.Chosen = w.spec.Name
	if s.cfg.Policy != PolicySluice {
		rec.Reason = reason
		rec.Candidates[idx[best]].Rank = 1
		rec.SetExplain(explainFull)
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
)

// explainFull fills in the reason of candidates skipped for being at their
// concurrency limit: the only ineligible ones left without words.
func explainFull(r *decisions.Record) {
	for i := range r.Candidates {
		if c := &r.Candidates[i]; !c.Eligible && c.Why == "" {
			c.Why = fmt.Sprintf("at max_concurrency (%d/%d)", c.Active, c.Limit)
		}
	}
}

// scoreLocked scores the eligible candidates, fills their records and
// returns the index of the winner: lowest total, then least recently
// picked, then first in configuration order (with a Ledger, the ledger's
// choice; -1 when it has no room). The per-term breakdown is
// attached to the record to be computed when it is read.
func (s *Scheduler) scoreLocked(rec *decisions.Record, req *Request, cands []Candidate, idx []int, elig []*worker, kept []keptWorker, now time.Time) int {
	// The terms see the request through the scratch space: an Env on the
	// stack would escape through the Term interface, and the request with it.
	sc := &s.scratch
	sc.req = *req
	sc.env = Env{Now: now, StaleAfter: s.cfg.StaleAfter, Req: &sc.req}
	tot := totals(s.terms, &sc.env, cands, sc)
	key := func(i int) rankKey { return rankKey{tot[i], elig[i].lastPick, elig[i].order} }
	best := 0
	if s.cfg.Ledger != nil && s.shared.binding {
		best = s.reserveSharedLocked(rec, req, cands, tot, elig, key)
	} else {
		for i := 1; i < len(cands); i++ { // one pass: only the winner is needed now
			if key(i).less(key(best)) {
				best = i
			}
		}
	}
	if best < 0 {
		return -1
	}
	if rec == nil {
		return best
	}
	// Ranks, the breakdown and the reason in words are built when the
	// record is read, from values that from here on belong to the record.
	for i := range cands {
		// Active as scored: with a Ledger, the count across replicas.
		rec.Candidates[idx[i]].Active, rec.Candidates[idx[i]].Total = cands[i].Active, tot[i]
		elig[i].last, elig[i].lastIdx = rec, idx[i]
	}
	frozen := cands
	terms := s.terms
	won := -1 // with a Ledger, its choice: ties and shared limits were its
	if s.cfg.Ledger != nil && s.shared.binding {
		won = best
	}
	in := &explainInput{env: sc.env, req: *req}
	in.env.Req = &in.req // the record must not see later changes to the request
	rec.SetExplain(func(r *decisions.Record) {
		env := &in.env
		explainFull(r)
		// The eligible candidates as scored, in configuration order.
		var at []int
		for i := range r.Candidates {
			if r.Candidates[i].Eligible {
				at = append(at, i)
			}
		}
		keys := make([]rankKey, len(at))
		for j, i := range at {
			keys[j] = rankKey{r.Candidates[i].Total, kept[i].lastPick, kept[i].order}
		}
		for i, ts := range explain(terms, env, frozen) {
			r.Candidates[at[i]].Terms = ts
		}
		order := make([]int, len(keys))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int {
			switch {
			case a == won:
				return -1
			case b == won:
				return 1
			case keys[a].less(keys[b]):
				return -1
			case keys[b].less(keys[a]):
				return 1
			}
			return 0
		})
		for rank, i := range order {
			r.Candidates[at[i]].Rank = rank + 1
		}
		first := keys[order[0]].total
		switch {
		case r.Chosen == "":
			// A refusal's record: the ranks say who would have gone
			// first, its reason why nobody did (refuseWithLocked).
		case len(order) == 1:
			r.Reason = fmt.Sprintf("only eligible worker (score %.2f)", first)
		case won >= 0 && keys[order[1]].total < first:
			c := &r.Candidates[at[order[1]]]
			r.Reason = fmt.Sprintf("lowest score %.2f with room across replicas; %s at %.2f is at its limit there (%d/%d)", first, frozen[order[1]].Name, keys[order[1]].total, c.Active, c.Limit)
		case won >= 0 && keys[order[1]].total == first:
			r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked by any replica (the shared ledger's pick sequence), then the first listed, wins", first, frozen[order[1]].Name)
		case keys[order[1]].total == first:
			r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked, then the first listed, wins", first, frozen[order[1]].Name)
		default:
			r.Reason = fmt.Sprintf("lowest score %.2f (next: %s at %.2f)", first, frozen[order[1]].Name, keys[order[1]].total)
		}
	})
	return best
}

// explainInput is the decision's Env and request as a record keeps them,
// in one allocation.
type explainInput struct {
	env Env
	req Request
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
