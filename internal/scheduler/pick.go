package scheduler

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/promise"
	"github.com/sluice-router/sluice/internal/sessions"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// pick is one request's pick, made afresh and passed from stage to stage
// (docs/architecture.md lists them). Only the resolve stage
// (newPickLocked) and the picker read or write the scheduler's guarded
// state; the other stages are functions of the pick and the immutable
// configuration (conf), testable on a pick built by hand.
type pick struct {
	conf *pickConf
	req  Request
	env  Env // of the decision; env.Req is &req
	// binding says the pick's choice will be bound (not a refusal's
	// record): only then may the shared ledger be asked.
	binding  bool
	baseline bool // a baseline policy: no limits, no scoring, no queue
	shared   bool // a shared Ledger orders binds across replicas
	learning bool // limits are learned (Sluice's policy, not Fixed)
	floor    float64
	waited   time.Duration
	// out and outSrc are the request's expected output and where that
	// came from (internal/outlen), when a prediction or a record needs them.
	out    float64
	outSrc string
	// beliefs are what a candidate's Belief is set from (prefix.go);
	// session backs beliefs.session.
	beliefs beliefSrc
	session sessions.Last

	bufs  *pickBufs   // where views and elig come from (release)
	views []view      // every worker, in configuration order
	elig  []int32     // the eligible ones (indexes into views), in order
	cands []Candidate // what the terms see of elig[i]
	total []float64   // the score's totals of cands, when scored

	// kvHeld says the KV-fit rule passed over every eligible worker.
	kvHeld bool

	// Admission by promise (promise.go): bySLO says the stage runs;
	// judged are the eligible workers' predictions (parallel to cands).
	bySLO   bool
	arrived time.Time
	promise promise.Judgment
	judged  []promise.Worker
	// pending is the reservation the ledger is to make (ledger.go).
	pending *reservation
	// adapter is the request's LoRA adapter, nil when its model is none
	// (adapter.go).
	adapter *adapterPick
}

// pickConf is what the stages read of the scheduler's configuration:
// set by New and never changed, so read without the lock.
type pickConf struct {
	cfg    *Config
	terms  []WeightedTerm
	limits *limit.Config
	// prefixWeighted: the prefix term counts; affinity: the backlog rules
	// apply (affinityOn); sessions: the session table is on.
	prefixWeighted, affinity, sessions bool
}

// affine reports whether req has anything the prefix term can match:
// prompt blocks, or a session the table may know.
func (c *pickConf) affine(req *Request) bool {
	return len(req.Prefix) > 0 || (c.sessions && req.Session != "")
}

// view is one worker as a pick resolved it once: its telemetry, stats,
// counters and limit, and why it is or is not eligible. Stages read the
// counters here, never on w.
type view struct {
	w    *worker
	snap *snapshot.Snapshot
	st   *stats.WorkerStats
	lim  viewLimit
	// The worker's counters as the pick found them (worker).
	active, remote int
	cost           float64
	lastPick       uint64
	kvSent         []kvSent // its requests in flight with KV blocks (kvsent.go)
	draining       bool
	why            uint8 // whyEligible, or the code of the filter that dropped it
	serving        bool  // it serves the requested model
	// For a request naming a LoRA adapter: the worker holds it (or is
	// loading it), or may load it now (adapter.go).
	holds, loadable bool
}

// viewLimit is the part of a worker's limit.State the later stages read,
// kept small because a view is written for every worker on every pick.
type viewLimit struct {
	limit, learned, cap int
	floor               float64
	prefix              float64 // >0: one stream over the learned limit for a cached prefix (affinity.go)
	source              limit.Source
	sat                 limit.Saturation
}

// viewLimitOf returns what a view keeps of st.
func viewLimitOf(st *limit.State) viewLimit {
	return viewLimit{limit: st.Limit, learned: st.Learned, cap: st.Cap, floor: st.Floor, prefix: st.Prefix, source: st.Source, sat: st.Sat}
}

// pickBufs are a pick's per-worker scratch, pooled so a pick on a large
// fleet allocates none; nothing in them outlives the pick.
type pickBufs struct {
	views []view
	elig  []int32
	cands []Candidate
}

var pickPool = sync.Pool{New: func() any { return new(pickBufs) }}

// release puts p's views and eligible indexes back in pickPool; p must
// not be used afterwards.
func (p *pick) release() {
	clear(p.views) // hold no worker or snapshot while pooled
	clear(p.bufs.cands)
	p.bufs.views, p.bufs.elig, p.bufs.cands = p.views[:0], p.elig[:0], p.bufs.cands[:0]
	pickPool.Put(p.bufs)
	p.bufs, p.views, p.elig = nil, nil, nil
}

// room returns the workers p found full, or too short for the prompt, at
// their learned limit (choice.room); nil when the affinity rules are off.
func (p *pick) room() []*worker {
	if !p.learning || !p.conf.affinity {
		return nil
	}
	n := 0 // counted first: one allocation of the right size
	for i := range p.views {
		if inRoom(&p.views[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	room := make([]*worker, 0, n)
	for i := range p.views {
		if v := &p.views[i]; inRoom(v) {
			room = append(room, v.w)
		}
	}
	return room
}

// inRoom reports whether v belongs in its pick's room (choice.room).
func inRoom(v *view) bool {
	return (v.why == whyFull || v.why == whyContext) && atLearnedLimit(v)
}

// at returns the view of the j-th eligible worker.
func (p *pick) at(j int) *view { return &p.views[p.elig[j]] }

// choice is a pick's outcome: the worker chosen (nil: nobody), its limit,
// the decision record (nil without records, and when nobody was eligible
// unless one was asked for), and what the caller does next.
type choice struct {
	w       *worker
	limit   int
	rec     *decisions.Record
	pending *reservation
	kvHeld  bool
	// sloWait says the promise stage chose to wait for this request
	// (promise.Wait): a request behind it may be placed meanwhile.
	sloWait bool
	// refuse says the promise stage refused the request (on_miss:
	// refuse); pred is the chosen worker's prediction, when one was made.
	refuse bool
	pred   *predict.Prediction
	// found is what the request found on the chosen worker, for its
	// outcome (Lease.Complete); only with a Predictor.
	found predict.Input
	// room are the workers found full at their learned limit when nobody
	// was chosen: the holder-first rule asks only them (affinity.go).
	room []*worker
}

// pickLocked runs a pick for req, which arrived at arrived (the promise
// stage counts its objective from then). When no worker is eligible it
// returns no record unless always is set (a refusal needs one).
func (s *Scheduler) pickLocked(req Request, arrived, now time.Time, always bool) choice {
	p := s.newPickLocked(req, now, !always)
	defer p.release()
	p.arrived = arrived
	p.eligible()
	if len(p.elig) == 0 && (!always || s.cfg.NoRecords) {
		return choice{kvHeld: p.kvHeld, room: p.room()}
	}
	p.candidates()
	if p.bySLO && len(p.elig) > 0 && !always {
		var d *derived
		if s.cfg.DefaultSLO == (predict.SLO{}) {
			d = s.derivedLocked(req.Model, now)
		}
		p.promiseStage(d)
		if p.promise.Verdict == promise.Refuse {
			return choice{refuse: true, kvHeld: p.kvHeld, rec: s.refusalRecordLocked(req, now)}
		}
		if len(p.elig) == 0 {
			// It waits (promise.Wait, or every worker at its learned limit).
			return choice{kvHeld: p.kvHeld, sloWait: p.promise.Verdict == promise.Wait, room: p.room()}
		}
	}
	var pr *pickRecord
	if !s.cfg.NoRecords {
		pr = newPickRecord(p)
		s.fillRecord(&pr.rec, &p.req, p.env.Now, p.out, p.outSrc)
	}
	c := choice{kvHeld: p.kvHeld}
	if always && pr != nil && !p.baseline {
		// A refusal's record: who could have taken the request, scored
		// when the record is read, not under the lock.
		pr.unscored = len(p.elig) > 0
	} else if len(p.elig) > 0 {
		best := s.picker.choose(p, pr) // the picker's position is the scheduler's
		if s.ledger != nil && p.binding && !p.baseline {
			// The ledger chooses, outside the lock; best is held meanwhile.
			p.pending = newReservation(p, pr, s.activeWeight())
		}
		c = p.chosen(best, pr, always)
	}
	if pr == nil {
		return c
	}
	if len(p.elig) == 0 {
		pr.rec.Reason = "no eligible worker"
	}
	if pr.keep(p) {
		for j := range p.elig { // the record scored them: their latest decision
			v := p.at(j)
			v.w.last, v.w.lastIdx = &pr.rec, int(p.elig[j])
		}
	}
	pr.rec.SetExplain(pr.explain)
	c.rec = &pr.rec
	return c
}

// eligible runs the filters, and the affinity relaxation when they leave
// nobody, leaving the eligible workers in p.elig.
func (p *pick) eligible() {
	p.elig = slices.Grow(p.bufs.elig[:0], len(p.views))[:len(p.views)]
	for i := range p.elig {
		p.elig[i] = int32(i)
	}
	p.elig = keepRules(p, p.elig) // whyDraining through whyFull
	p.elig = filters[whyAdapter].keep(p, p.elig, whyAdapter)
	if len(p.elig) == 0 && p.learning && p.conf.affine(&p.req) && p.conf.affinity {
		p.affinityBorrow()
		if p.adapter != nil { // a borrowed worker must hold the adapter too
			p.elig = filters[whyAdapter].keep(p, p.elig, whyAdapter)
		}
	}
	if !p.baseline && p.conf.cfg.KVFit {
		p.elig = filters[whyKVFit].keep(p, p.elig, whyKVFit)
	}
}

// chosen completes the choice of p's eligible worker best: the
// prediction and what the record says of them.
func (p *pick) chosen(best int, pr *pickRecord, always bool) choice {
	v := p.at(best)
	c := choice{w: v.w, limit: v.lim.limit, pending: p.pending, kvHeld: p.kvHeld}
	predictor := p.conf.cfg.Predictor
	if predictor != nil && !p.baseline && !always {
		c.found = p.inputFor(v, &p.cands[best])
		if p.bySLO && len(p.judged) > best {
			c.pred = &p.judged[best].Pred
		} else if p.pending == nil {
			pred := predictor.Predict(v.w.spec.Name, c.found)
			c.pred = &pred
		}
	}
	if pr == nil {
		return c
	}
	pr.rec.Chosen, pr.chosen = v.w.spec.Name, v.w.order
	if p.adapter != nil {
		state := "loaded"
		if !v.holds {
			state = "loading on demand"
		}
		pr.rec.Adapter = adapterRecord(p.adapter, state)
	}
	if c.pred != nil {
		_, why := predictor.Trusted(v.w.spec.Name)
		pr.rec.Promise = p.promise.Record(c.pred, why)
		pr.rec.Promise.ExpectedCachedTokens = c.found.CachedTokens
	}
	return c
}

// newPickLocked is the resolve stage: it starts a pick for req with a
// view of every worker (telemetry, stats, counters and limit, noting a
// learned limit's move), the model's floor and queue wait when limits are
// learned, the output estimate and the session's last worker.
func (s *Scheduler) newPickLocked(req Request, now time.Time, binding bool) *pick {
	p := &pick{conf: s.conf, req: req, binding: binding, baseline: s.cfg.Policy != PolicySluice}
	p.env = Env{Now: now, StaleAfter: s.cfg.StaleAfter, Req: &p.req}
	p.learning = !p.baseline && !s.limits.Fixed
	p.shared = s.cfg.Ledger != nil
	p.bySLO = s.promiseOn(p)
	p.adapter = s.adapterOf(req.Model)
	p.bufs = pickPool.Get().(*pickBufs)
	p.views = slices.Grow(p.bufs.views[:0], len(s.workers))[:len(s.workers)]
	// Each worker's telemetry and stats are read once for the whole pick:
	// the floor, the limits, the filters and the terms all read them.
	best := 0.0
	for i, w := range s.workers {
		v := &p.views[i]
		*v = view{w: w, snap: w.snapshot(), st: s.measured.of(w), active: w.active, remote: w.remote, cost: w.cost,
			lastPick: w.lastPick, kvSent: w.kvSent, draining: w.draining}
		v.serving = w.serves(v.snap, p.req.Model)
		if p.learning && v.serving {
			best = limit.BestSolo(best, v.st)
		}
	}
	if p.adapter != nil {
		p.resolveAdapter()
	}
	if !s.cfg.NoRecords || (s.cfg.Predictor != nil && !p.baseline) {
		p.out, p.outSrc = s.est.Estimate(outOf(&p.req))
	}
	p.beliefs = beliefSrc{conf: s.conf, now: now}
	if s.conf.sessions && req.Session != "" && s.cfg.PrefixIndex != nil && !p.baseline && (s.prefixWeighted || s.conf.affinity) {
		if e := s.sessions.Lookup(req.Model, req.Session, now); e != nil {
			p.session = *e
			p.beliefs.session = &p.session
		}
	}
	if p.learning {
		p.floor = s.limits.Floor(p.req.Model, best)
		p.waited = s.queues.of(p.req.Model).OldestWait(p.env.Now)
	}
	for i := range p.views {
		v := &p.views[i]
		switch {
		case p.baseline: // no limits
		case !p.learning: // fixed: the cap, a limit never learned, nothing to note
			capN, src := s.limits.Cap(v.w.spec.MaxConcurrency, v.snap.Slots)
			v.lim = viewLimit{limit: capN, learned: capN, cap: capN, source: src}
		default:
			st := v.w.limitOf(s.limits, v.snap, v.st, p.floor, p.waited, &p.env)
			v.w.moved.Note(&st, p.env.Now)
			v.lim = viewLimitOf(&st)
		}
	}
	return p
}

// candidates writes what the terms see of each eligible worker, with its
// Belief when the prefix term counts.
func (p *pick) candidates() {
	p.bufs.cands = slices.Grow(p.bufs.cands[:0], len(p.elig))[:len(p.elig)]
	p.cands = p.bufs.cands
	for j := range p.elig {
		v := p.at(j)
		p.cands[j] = Candidate{Name: v.w.spec.Name, Snap: v.snap, Stats: v.st, Active: v.active, JobCost: v.cost}
	}
	if p.conf.prefixWeighted && !p.baseline && len(p.cands) > 0 {
		p.beliefs.set(&p.req, p.cands, func(j int) []kvSent { return p.at(j).kvSent })
	}
}

// refusalRecordLocked returns the record of a refusal of req (nil without
// records); it scores nobody under the lock, the ranks being computed when
// the record is read.
func (s *Scheduler) refusalRecordLocked(req Request, now time.Time) *decisions.Record {
	if s.cfg.NoRecords {
		return nil
	}
	return s.pickLocked(req, now, now, true).rec
}

// excluded reports whether req already failed on w.
func excluded(req *Request, w *worker) bool {
	return len(req.Exclude) > 0 && slices.Contains(req.Exclude, w.spec.Name)
}
