package scheduler

import (
	"slices"
	"time"
	"unsafe"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/stats"
)

// A pick chooses the worker for one request, in stages, each a small step
// with one job, run in this order under the scheduler's lock:
//
//	resolve     each worker's telemetry and stats, read once      (view)
//	limits      each worker's concurrency limit                    (limit.go)
//	filters     eligibility, one rule each, with a reason code     (filter*.go)
//	relax       one stream over a learned limit for a cached prefix,
//	            when no worker is left                             (affinity.go)
//	kv fit      pass over workers whose KV cache cannot take it    (kvfit.go)
//	candidates  what the terms see of each eligible worker          (Candidate)
//	picker      the policy's choice; Sluice's by the terms' score  (picker.go, terms.go)
//	record      what the decision record is explained from, later  (record.go)
//
// With a shared Ledger a pick that will be bound then holds its choice
// and the reserver asks the ledger, outside the lock (reserver.go).
//
// The stages pass one value, the pick, from one to the next instead of
// leaving scratch on the Scheduler or its workers; its buffers are kept
// for the next pick, so a pick that finds nobody allocates nothing. What
// a caller needs of a pick once it is made is its choice.
type pick struct {
	req Request
	env Env // of the decision; env.Req is &req
	// binding says the pick's choice will be bound (not a refusal's
	// record): only then may the shared ledger be asked.
	binding  bool
	baseline bool // a baseline policy: no limits, no scoring, no queue
	shared   bool // a shared Ledger orders binds across replicas
	learning bool // limits are learned (Sluice's policy, not Fixed)
	floor    float64
	waited   time.Duration

	views []view      // every worker, in configuration order
	elig  []int32     // the eligible ones (indexes into views), in order
	cands []Candidate // what the terms see of elig[i]

	// kvHeld says the KV-fit rule passed over every eligible worker.
	kvHeld bool

	// Admission by promise (promise.go): bySLO says the stage runs;
	// arrived is when the request came, out its expected output; preds
	// are the predictions of the eligible workers (parallel to cands),
	// meets the stage's space.
	bySLO   bool
	arrived time.Time
	out     float64
	promise promiseState
	preds   []predict.Prediction
	meets   []bool
	// pending is the reservation the ledger is to make (ledger.go).
	pending *reservation
	// adapter is the request's LoRA adapter, nil when its model is none
	// (adapter.go); adapterBuf is its space.
	adapter    *adapterPick
	adapterBuf adapterPick
}

// view is one worker as a pick sees it: what the pick resolved of it once
// (its telemetry, stats and limit) and why it is or is not eligible.
type view struct {
	w    *worker
	snap *Snapshot
	st   *stats.WorkerStats
	lim  limitState
	// limFor is what lim was computed from while lim holds for as long
	// as they stay the same (limitKey); zero otherwise.
	limFor  limitKey
	why     uint8 // whyEligible, or the code of the filter that dropped it
	serving bool  // it serves the requested model
	// For a request naming a LoRA adapter: the worker holds it (or is
	// loading it), or may load it now (adapter.go).
	holds, loadable bool
}

// at returns the view of the j-th eligible worker.
func (p *pick) at(j int) *view { return &p.views[p.elig[j]] }

// choice is a pick's outcome: the worker chosen (nil: nobody), its limit
// at the pick, the decision record (nil without records, and when nobody
// was eligible unless one was asked for), and what the caller does next:
// ask the ledger (pending), or let a request behind wait less (kvHeld).
type choice struct {
	w       *worker
	limit   int
	rec     *decisions.Record
	pending *reservation
	kvHeld  bool
	// sloWait says the promise stage chose to wait for this request
	// (verdictWait): a request behind it may be placed meanwhile.
	sloWait bool
	// refuse says the promise stage refused the request (on_miss:
	// refuse); pred is the chosen worker's prediction, when one was made.
	refuse bool
	pred   *predict.Prediction
	// found is what the request found on the chosen worker, for its
	// outcome (Lease.Complete); only with a Predictor.
	found predict.Input
}

// pickLocked runs a pick for req. When no worker is eligible it returns
// no record unless always is set (a refusal needs one): under a backlog
// every arrival and release asks, and most answers are "nobody", which
// must cost no allocation.
func (s *Scheduler) pickLocked(req Request, now time.Time, always bool) choice {
	return s.pickForLocked(req, now, now, always)
}

// pickForLocked is pickLocked for a request that arrived at arrived: the
// promise stage counts its objective from then.
func (s *Scheduler) pickForLocked(req Request, arrived, now time.Time, always bool) choice {
	p := s.startPickLocked(req, now, !always)
	p.arrived = arrived
	s.resolveLocked(p)
	if !p.baseline {
		s.limitsLocked(p)
	}
	p.elig = p.elig[:0]
	for i := range p.views {
		p.elig = append(p.elig, int32(i))
	}
	p.elig = keepRules(p, p.elig) // whyDraining through whyFull
	p.elig = filters[whyAdapter].keep(p, p.elig, whyAdapter)
	if len(p.elig) == 0 && p.learning && s.affine(&req) && s.affinityOn() {
		s.affinityBorrowLocked(p)
		for _, i := range p.elig { // their limits, raised for this request, are not limitsLocked's
			p.views[i].limFor = limitKey{}
		}
		if p.adapter != nil { // a borrowed worker must hold the adapter too
			p.elig = filters[whyAdapter].keep(p, p.elig, whyAdapter)
		}
	}
	if !p.baseline && s.cfg.KVFit {
		p.elig = filters[whyKVFit].keep(p, p.elig, whyKVFit)
	}
	if len(p.elig) == 0 && (!always || s.cfg.NoRecords) {
		return choice{kvHeld: p.kvHeld}
	}
	s.candidatesLocked(p)
	if p.bySLO && len(p.elig) > 0 && !always {
		s.startPromiseLocked(p)
		s.promiseLocked(p)
		if p.promise.verdict == verdictRefuse {
			return choice{refuse: true, kvHeld: p.kvHeld, rec: s.refusalRecordLocked(req, now)}
		}
		if len(p.elig) == 0 {
			// It waits (verdictWait, or every worker at its learned limit).
			return choice{kvHeld: p.kvHeld, sloWait: p.promise.verdict == verdictWait}
		}
	}
	var pr *pickRecord
	if !s.cfg.NoRecords {
		pr = s.newPickRecordLocked(p)
	}
	c := choice{kvHeld: p.kvHeld}
	if always && pr != nil && !p.baseline {
		// A refusal's record: who could have taken the request, scored
		// when the record is read, not under the lock.
		pr.unscored = len(p.elig) > 0
	} else if len(p.elig) > 0 {
		best := s.picker.choose(p, pr)
		if s.ledger != nil && p.binding && !p.baseline {
			// The ledger chooses, outside the lock; best is held meanwhile.
			s.pendingSharedLocked(p, pr)
		}
		v := p.at(best)
		c.w, c.limit, c.pending = v.w, v.lim.limit, p.pending
		if s.cfg.Predictor != nil && !p.baseline && !always {
			c.found = s.inputFor(p, v, &p.cands[best])
			if p.bySLO && len(p.preds) > best {
				pred := p.preds[best] // a copy: the buffer is the next pick's
				c.pred = &pred
			} else if p.pending == nil {
				pred := s.cfg.Predictor.Predict(v.w.spec.Name, c.found)
				c.pred = &pred
			}
		}
		if pr != nil {
			pr.rec.Chosen, pr.chosen = v.w.spec.Name, v.w.order
			if p.adapter != nil {
				state := "loaded"
				if !v.holds {
					state = "loading on demand"
				}
				pr.rec.Adapter = adapterRecord(p.adapter, state)
			}
			if c.pred != nil {
				_, why := s.cfg.Predictor.Trusted(v.w.spec.Name)
				pr.rec.Promise = promiseRecord(&p.promise, c.pred, why)
				pr.rec.Promise.ExpectedCachedTokens = c.found.CachedTokens
			}
		}
	}
	if len(p.elig) == 0 && pr != nil {
		pr.rec.Reason = "no eligible worker"
	}
	if pr == nil {
		return c
	}
	pr.keepLocked(s, p)
	pr.rec.SetExplain(pr.explain)
	c.rec = &pr.rec
	return c
}

// startPickLocked readies the scheduler's pick for req: the request, the
// time, the policy's mode, and buffers for every worker.
func (s *Scheduler) startPickLocked(req Request, now time.Time, binding bool) *pick {
	p := &s.pk
	p.req = req
	p.env = Env{Now: now, StaleAfter: s.cfg.StaleAfter, Req: &p.req}
	p.binding = binding
	p.baseline = s.cfg.Policy != PolicySluice
	p.learning = !p.baseline && !s.limits.Fixed
	p.shared = s.cfg.Ledger != nil
	p.bySLO = s.promiseOn(p)
	p.promise = promiseState{}
	p.out = 0 // the request's expected output: estimated when first needed
	p.floor, p.waited = 0, 0
	p.kvHeld, p.pending = false, nil
	p.adapter = s.adapterOfLocked(req.Model)
	n := len(s.workers)
	if cap(p.views) < n {
		p.views, p.elig, p.cands = make([]view, n), make([]int32, 0, n), make([]Candidate, 0, n)
	}
	p.views = p.views[:n]
	return p
}

// resolveLocked reads each worker's telemetry and stats once for the
// whole pick: the floor, the limits, the filters and the terms all read
// them. With learned limits it also finds the model's floor (configured,
// or FloorFraction of the best solo decode rate among its workers) and
// how long its oldest queued request has waited.
func (s *Scheduler) resolveLocked(p *pick) {
	best := 0.0
	for i, w := range s.workers {
		v := &p.views[i]
		setPtr(&v.w, w)
		setPtr(&v.snap, w.snapshot())
		setPtr(&v.st, s.statsOf(w))
		v.serving = w.serves(v.snap, p.req.Model)
		v.why = whyEligible
		if p.baseline {
			v.lim, v.limFor = limitState{}, limitKey{} // none; else limitsLocked writes it whole
		}
		v.holds, v.loadable = false, false
		if p.learning && v.serving {
			best = bestSolo(best, v.st)
		}
	}
	if p.adapter != nil {
		s.resolveAdapterLocked(p)
	}
	if !p.learning {
		return
	}
	var ok bool
	if p.floor, ok = s.configuredFloor(p.req.Model); !ok {
		p.floor = s.limits.FloorFraction * best
	}
	p.waited = s.oldestWaitLocked(p.req.Model, p.env.Now)
}

// limitsLocked computes every worker's concurrency limit for the pick
// (limit.go), and notes any change of a learned limit. The baselines
// have none: they neither queue nor respect max_concurrency. A view
// whose limit was computed from the same inputs at an earlier pick, and
// does not depend on the time, keeps it: from one pick to the next most
// workers' telemetry, stats and counts are the same.
func (s *Scheduler) limitsLocked(p *pick) {
	for i := range p.views {
		v := &p.views[i]
		key := limitKey{w: v.w, snap: v.snap, st: v.st, maxConcurrency: v.w.spec.MaxConcurrency, floor: p.floor, waited: p.waited}
		if v.limFor != key {
			s.limitInto(&v.lim, v.w, v.snap, v.st, p.floor, p.waited, p.env.Now)
			v.limFor = limitKey{}
			if v.lim.timeless(v.snap) {
				v.limFor = key
			}
		}
		v.w.noteLimitLocked(&v.lim, p.env.Now)
	}
}

// candidatesLocked writes what the terms see of each eligible worker,
// with its Belief when the prefix term counts.
func (s *Scheduler) candidatesLocked(p *pick) {
	cands := p.cands[:0]
	for _, i := range p.elig {
		v := &p.views[i]
		cands = cands[:len(cands)+1]
		// Field by field, every one, over the previous pick's: a struct
		// literal (or a zeroed append) is copied in with a bulk write barrier.
		c := &cands[len(cands)-1]
		setStr(&c.Name, v.w.spec.Name)
		setPtr(&c.Snap, v.snap)
		setPtr(&c.Stats, v.st)
		setStr(&c.PrefixSource, "")
		c.Active, c.JobCost, c.PrefixMatch, c.KVSeq = v.w.active, v.w.cost, 0, 0
	}
	p.cands = cands
	if s.prefixWeighted && !p.baseline && len(cands) > 0 {
		s.beliefsLocked(&p.req, cands)
	}
}

// setPtr and setStr write a pointer or string only when it changes. A
// pick rewrites every worker's view, candidate and slot over the previous
// pick's, and from one pick to the next most of them point where they
// did; an unconditional write of a pointer costs a write barrier while the
// GC runs, which made up a third of a pick's time.
func setPtr[T any](dst **T, v *T) {
	if *dst != v {
		*dst = v
	}
}

func setStr(dst *string, v string) {
	if unsafe.StringData(*dst) != unsafe.StringData(v) || len(*dst) != len(v) {
		*dst = v
	}
}

// refusalRecordLocked returns the record of a refusal of req: who could
// have taken it and why nobody did (nil without records). It scores
// nobody under the lock: the ranks are computed when the record is read.
func (s *Scheduler) refusalRecordLocked(req Request, now time.Time) *decisions.Record {
	if s.cfg.NoRecords {
		return nil
	}
	return s.pickLocked(req, now, true).rec
}

// excluded reports whether req already failed on w.
func excluded(req *Request, w *worker) bool {
	return len(req.Exclude) > 0 && slices.Contains(req.Exclude, w.spec.Name)
}
