package vsim

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// Epoch is the virtual time a simulation starts at when Config.Start is
// zero: a fixed instant, so runs are reproducible to the nanosecond.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Config describes one simulated router and its fleet.
type Config struct {
	// Workers are the simulated GPU workers; their TimeScale is ignored
	// (virtual time has no scale).
	Workers []sim.WorkerSpec
	// Model is the model every request asks for; the first worker's
	// model when empty.
	Model string
	// Policy is the routing policy; empty means Sluice's.
	Policy scheduler.Policy
	// Weights are the router's weights (weights.prefix); nil keeps
	// scheduler.DefaultWeights.
	Weights *config.Weights
	// MaxConcurrency caps Sluice's in-flight requests per worker, as the
	// config's max_concurrency; 0 takes the worker's slot count.
	MaxConcurrency int
	// Limits overrides MaxConcurrency per worker name, as a router config
	// sets max_concurrency per worker (a slower card may take fewer).
	Limits map[string]int
	// Concurrency configures the adaptive limit below those caps.
	Concurrency limit.Config
	// MaxQueue and QueueTimeout are the admission bounds.
	MaxQueue     int
	QueueTimeout time.Duration
	// MaxOvertake is the queue order's aging bound; 0 takes
	// scheduler.DefaultMaxOvertake.
	MaxOvertake time.Duration
	// KVFit is admission.kv_fit.
	KVFit bool
	// Admission is admission.mode (scheduler.AdmitByLimits when empty);
	// SLOs are admission.slo, the classes' SLOs.
	Admission string
	SLOs      map[string]predict.SLO
	// ScrapeInterval is the telemetry interval; 0 means 1s.
	ScrapeInterval time.Duration
	// StaleAfter marks telemetry older than this stale in records.
	StaleAfter time.Duration
	// Seed seeds the random baselines.
	Seed uint64
	// Start is the virtual time the engines are created at; Epoch when
	// zero. Requests arrive relative to the moment every worker has
	// loaded its model (the HTTP benchmark also waits for a ready fleet).
	Start time.Time
	// Recorder, if set, receives every decision record, as the router's
	// decision log would.
	Recorder func(*decisions.Record)
	// SessionAffinity, SessionTTL and FairShareBySession are
	// sessions.affinity, sessions.ttl and admission.fair_share_by:
	// session; items name their session in Item.Session, as a client's
	// X-Session-ID header would.
	SessionAffinity    bool
	SessionTTL         time.Duration
	FairShareBySession bool
	// KVEvents gives the router the exact index of the engines' KV-cache
	// events, as workers[].kv_events does, and requests their token
	// blocks (kvevents.go); off, the prefix term has the guess only.
	KVEvents bool
}

// DefaultConfig returns a Config for workers with the router's default
// admission, telemetry and stats settings (config.DefaultConfig).
func DefaultConfig(workers []sim.WorkerSpec) Config {
	return FromRouterConfig(config.DefaultConfig(), workers)
}

// FromRouterConfig returns the Config that simulates a router configured
// by rc in front of workers: policy, weights, admission bounds, telemetry
// interval and staleness come from rc. The max_concurrency of
// rc's first worker, if any, applies to every simulated worker.
func FromRouterConfig(rc config.Config, workers []sim.WorkerSpec) Config {
	w := rc.Weights
	c := Config{
		Workers:            workers,
		Policy:             rc.Policy,
		Weights:            &w,
		MaxQueue:           rc.Admission.MaxQueue,
		QueueTimeout:       rc.Admission.QueueTimeout,
		MaxOvertake:        rc.Admission.MaxOvertake,
		KVFit:              rc.Admission.KVFit,
		Admission:          rc.Admission.Mode,
		SLOs:               rc.Admission.SLO,
		ScrapeInterval:     rc.Telemetry.Interval,
		StaleAfter:         rc.Telemetry.StaleAfter,
		Concurrency:        rc.Limits.Scheduler(),
		SessionAffinity:    rc.Sessions.Affinity,
		SessionTTL:         rc.Sessions.TTL,
		FairShareBySession: rc.Admission.FairShareBy == config.FairShareBySession,
	}
	if len(rc.Workers) > 0 {
		c.MaxConcurrency = int(rc.Workers[0].MaxConcurrency)
	}
	for _, w := range rc.Workers {
		if w.MaxConcurrency > 0 {
			if c.Limits == nil {
				c.Limits = map[string]int{}
			}
			c.Limits[w.Name] = int(w.MaxConcurrency)
		}
	}
	return c
}

// limitOf is the max_concurrency of the named worker.
func (c Config) limitOf(name string) int {
	if n, ok := c.Limits[name]; ok {
		return n
	}
	return c.MaxConcurrency
}

// vclock is the scheduler's Clock: whatever the loop last set.
type vclock struct{ now time.Time }

func (c *vclock) Now() time.Time { return c.now }

// NewTimer is never used by the simulation, which times queued requests
// out itself (Cancel at the deadline); the timer never fires.
func (c *vclock) NewTimer(time.Duration) scheduler.Timer { return idleTimer{} }

type idleTimer struct{}

func (idleTimer) C() <-chan time.Time { return nil }
func (idleTimer) Stop() bool          { return true }

// source publishes a worker's latest snapshot; the loop replaces it at
// every scrape, the scheduler reads it.
type source struct {
	p atomic.Pointer[snapshot.Snapshot]
}

func (s *source) Snapshot() *snapshot.Snapshot { return s.p.Load() }

type vworker struct {
	name    string
	eng     *sim.Engine
	src     source
	version uint64 // of its entry in the engine heap
	watched bool   // in the scrape set
	touched bool   // anything happened since the last scrape
}

// request is one item's progress through the simulation.
type request struct {
	item     bench.Item
	ticket   *scheduler.Ticket
	lease    *scheduler.Lease
	worker   int
	bound    time.Time
	first    time.Time
	ended    bool
	inQueue  bool     // counted in run.queued
	follower bool     // sent once the request it follows has ended
	kvBlocks []uint64 // the request's KVBlocks, with Config.KVEvents
}

// pending kinds.
const (
	pBound = iota
	pRefused
	pFirst
	pDone
)

// pendingEvent is a scheduler or engine callback waiting for the loop.
type pendingEvent struct {
	at   time.Time
	seq  uint64
	kind int
	req  int
	res  sim.Result
}

type pendingHeap []pendingEvent

func (h pendingHeap) Len() int { return len(h) }
func (h pendingHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h pendingHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)   { *h = append(*h, x.(pendingEvent)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// engineEntry says worker w's engine has its next event at t; it is stale
// unless version matches the worker's.
type engineEntry struct {
	t       time.Time
	w       int
	version uint64
}

type engineHeap []engineEntry

func (h engineHeap) Len() int { return len(h) }
func (h engineHeap) Less(i, j int) bool {
	if !h[i].t.Equal(h[j].t) {
		return h[i].t.Before(h[j].t)
	}
	return h[i].w < h[j].w
}
func (h engineHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *engineHeap) Push(x any)   { *h = append(*h, x.(engineEntry)) }
func (h *engineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type run struct {
	cfg      Config
	clock    *vclock
	sched    *scheduler.Scheduler
	tracker  *stats.Tracker
	workers  []*vworker
	byName   map[string]int
	reqs     []request
	results  []bench.Result
	t0       time.Time
	engines  engineHeap
	pending  pendingHeap
	pseq     uint64
	timeouts []int // queued requests by arrival, i.e. by deadline
	toHead   int
	watch    []int // workers to scrape
	balance  Balance
	loads    []int // scratch of scrape
	queued   int   // tickets waiting in the scheduler's queue
	events   int
	kv       *kvState // nil without Config.KVEvents
	// expected sums the prompt tokens the router expected the chosen
	// worker to hold, over bound requests (Stats.ExpectedCached).
	expected int64
	// onBind, when set, sees each request as it is bound, before its
	// engine has it: tests read the engines' caches there.
	onBind func(i int, l *scheduler.Lease)
	// followers are, by request, the requests sent once it has ended
	// (bench.Item.After); later holds those whose time is known.
	followers map[int][]int
	later     laterHeap
}

// laterEntry is a follower's arrival, known once the request it follows
// has ended.
type laterEntry struct {
	at  time.Time
	req int
}

type laterHeap []laterEntry

func (h laterHeap) Len() int { return len(h) }
func (h laterHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].req < h[j].req
}
func (h laterHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *laterHeap) Push(x any)   { *h = append(*h, x.(laterEntry)) }
func (h *laterHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Stats describes the work a simulation did, for profiling and docs.
type Stats struct {
	// Events counts the loop's iterations: arrivals, scrapes, timeouts
	// and engine wake-ups.
	Events int
	// VirtualSpan is the virtual time from the first arrival to the last
	// event.
	VirtualSpan time.Duration
	// Workers is the scheduler's view of every worker at the end: among
	// others each one's learned concurrency limit and why.
	Workers []scheduler.WorkerState
	// Balance is how evenly the requests were spread, scrape by scrape.
	Balance Balance
	// ExpectedCached sums, over the requests bound to a worker, the
	// prompt tokens the router expected that worker to hold in its prefix
	// cache: with KV events the exact index's match at the moment of
	// binding, in whole blocks, capped as the engine caps a hit; without,
	// the prefix term's guess (Lease.ExpectedCachedTokens). Against the
	// results' CachedTokens (what the engines found) it says how right
	// the router was.
	ExpectedCached int64
}

// Run simulates items (arrival offsets from the moment the fleet is ready)
// and returns one result per item, in item order.
func Run(cfg Config, items []bench.Item) ([]bench.Result, error) {
	res, _, err := RunStats(cfg, items)
	return res, err
}

// RunStats is Run that also reports how much work the simulation did.
func RunStats(cfg Config, items []bench.Item) ([]bench.Result, Stats, error) {
	r, err := newRun(cfg, items)
	if err != nil {
		return nil, Stats{}, err
	}
	end := r.loop()
	return r.results, Stats{Events: r.events, VirtualSpan: end.Sub(r.t0), Workers: r.sched.Workers(), Balance: r.balance, ExpectedCached: r.expected}, nil
}

func newRun(cfg Config, items []bench.Item) (*run, error) {
	if len(cfg.Workers) == 0 {
		return nil, errors.New("vsim: no workers")
	}
	if cfg.Start.IsZero() {
		cfg.Start = Epoch
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = time.Second
	}
	if cfg.Model == "" {
		cfg.Model = cfg.Workers[0].Params.Model
	}
	w := scheduler.DefaultWeights()
	if cfg.Weights != nil {
		w = cfg.Weights.Scheduler()
	}
	r := &run{cfg: cfg, clock: &vclock{now: cfg.Start}, byName: map[string]int{}}
	var err error
	if r.tracker, err = stats.NewTracker(stats.Alpha, nil, nil); err != nil {
		return nil, fmt.Errorf("vsim: stats: %w", err)
	}
	specs := make([]scheduler.WorkerSpec, len(cfg.Workers))
	r.t0 = cfg.Start
	for i, ws := range cfg.Workers {
		if err := ws.Params.Validate(); err != nil {
			return nil, fmt.Errorf("vsim: worker %q: %w", ws.Name, err)
		}
		if _, dup := r.byName[ws.Name]; dup {
			return nil, fmt.Errorf("vsim: duplicate worker name %q", ws.Name)
		}
		vw := &vworker{name: ws.Name, eng: sim.NewEngine(ws.Params, cfg.Start)}
		if ra := vw.eng.ReadyAt(); ra.After(r.t0) {
			r.t0 = ra
		}
		r.workers = append(r.workers, vw)
		r.byName[ws.Name] = i
		specs[i] = scheduler.WorkerSpec{Name: ws.Name, Models: []string{ws.Params.Model}, MaxConcurrency: cfg.limitOf(ws.Name), Source: &vw.src}
	}
	// Telemetry before the first scrape: loading, as a fresh router that
	// has probed once would see it. The first scrape is at t0.
	for _, vw := range r.workers {
		vw.src.p.Store(&snapshot.Snapshot{Health: snapshot.HealthLoading, Models: []string{vw.eng.Params().Model}, Slots: vw.eng.Params().Slots})
	}
	var kvIndex scheduler.KVIndex
	if cfg.KVEvents {
		r.kv = newKVState(r.workers)
		kvIndex = r.kv.index
	}
	r.sched, err = scheduler.New(scheduler.Config{
		KVIndex:         kvIndex,
		Weights:         w,
		MaxQueue:        cfg.MaxQueue,
		QueueTimeout:    cfg.QueueTimeout,
		MaxOvertake:     cfg.MaxOvertake,
		KVFit:           cfg.KVFit,
		StaleAfter:      cfg.StaleAfter,
		Policy:          cfg.Policy,
		Seed:            cfg.Seed,
		Clock:           r.clock,
		Stats:           r.tracker,
		Recorder:        cfg.Recorder,
		NoRecords:       cfg.Recorder == nil, // nobody would read them
		IDPrefix:        "vsim",
		PrefixIndex:     prefixIndex(cfg.Workers, items, r.clock),
		Limits:          cfg.Concurrency,
		Predictor:       predict.New(r.tracker),
		Admission:       cfg.Admission,
		SLOs:            cfg.SLOs,
		SessionAffinity: cfg.SessionAffinity,
		SessionTTL:      cfg.SessionTTL,
	}, specs...)
	if err != nil {
		return nil, fmt.Errorf("vsim: %w", err)
	}
	r.reqs = make([]request, len(items))
	r.results = make([]bench.Result, len(items))
	for i, it := range items {
		r.reqs[i] = request{item: it, worker: -1}
		r.results[i] = bench.Result{Index: i, Row: it.Row, Scheduled: it.At, Start: it.At, PromptTokens: it.PromptTokens, MaxTokens: max(1, it.OutputTokens), QueueMs: -1}
	}
	r.followers = followersOf(items)
	for _, fs := range r.followers {
		for _, f := range fs {
			r.reqs[f].follower = true
		}
	}
	return r, nil
}

// followersOf maps each item to the items that follow its answer
// (bench.Item.After), by index; nil when none does. An item naming a Row
// that no item has arrives at its At.
func followersOf(items []bench.Item) map[int][]int {
	var byRow map[int]int
	var out map[int][]int
	for i, it := range items {
		if it.After == 0 {
			continue
		}
		if byRow == nil {
			byRow = make(map[int]int, len(items))
			for j, x := range items {
				byRow[x.Row] = j
			}
			out = map[int][]int{}
		}
		if j, ok := byRow[it.After]; ok && j != i {
			out[j] = append(out[j], i)
		}
	}
	return out
}

// ended sends the followers of request i, which ended at at, each its
// pause later.
func (r *run) ended(i int, at time.Time) {
	for _, f := range r.followers[i] {
		rq := &r.reqs[f]
		arrive := at.Add(rq.item.Pause)
		rq.item.At = arrive.Sub(r.t0)
		r.results[f].Scheduled, r.results[f].Start = rq.item.At, rq.item.At
		heap.Push(&r.later, laterEntry{at: arrive, req: f})
	}
}

// loop runs every event and returns the virtual time of the last.
func (r *run) loop() time.Time {
	order := make([]int, 0, len(r.reqs))
	for i := range r.reqs {
		if !r.reqs[i].follower {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(r.reqs[a].item.At, r.reqs[b].item.At) })
	next := 0
	nextScrape := r.t0
	last := r.t0
	for {
		// The next global event: arrival, queue timeout or scrape.
		g, kind := nextScrape, 0
		if next < len(order) {
			if at := r.t0.Add(r.reqs[order[next]].item.At); at.Before(g) {
				g, kind = at, 1
			}
		}
		if len(r.later) > 0 && r.later[0].at.Before(g) {
			g, kind = r.later[0].at, 3
		}
		if to, ok := r.nextTimeout(); ok && to.Before(g) {
			g, kind = to, 2
		}
		// Engine events up to g come first.
		if !r.runEnginesUntil(g) {
			continue // an answer sent a follower before g
		}
		if r.done(next, len(order)) {
			break
		}
		r.events++
		r.clock.now = g
		last = g
		switch kind {
		case 0:
			r.scrape(g)
			nextScrape = g.Add(r.cfg.ScrapeInterval)
		case 1:
			r.arrive(order[next], g)
			next++
		case 2:
			r.timeout(g)
		case 3:
			r.arrive(heap.Pop(&r.later).(laterEntry).req, g)
		}
		r.drain()
	}
	for _, res := range r.results {
		if end := r.t0.Add(res.Start + res.E2E); end.After(last) {
			last = end
		}
	}
	return last
}

// done reports whether every request has ended and nothing is left to run.
func (r *run) done(next, n int) bool {
	if next < n || r.queued > 0 || len(r.later) > 0 {
		return false
	}
	for _, e := range r.engines {
		if e.version == r.workers[e.w].version {
			return false
		}
	}
	return true
}

// runEnginesUntil processes every engine event at or before g. While no
// request waits in the scheduler's queue, a finishing request cannot bind
// another before g, so each busy engine is advanced to g in one call and
// its callbacks are then handled in time order; with a queue, engines are
// stepped one event at a time, so a release binds the next request at the
// exact moment a slot frees. So are they when requests follow others'
// answers (bench.Item.After): an answer may send its follower before g,
// and then it stops there and reports false, for the loop to take the
// follower's arrival first.
func (r *run) runEnginesUntil(g time.Time) bool {
	for len(r.engines) > 0 {
		top := r.engines[0]
		if top.t.After(g) {
			return true
		}
		if len(r.later) > 0 && r.later[0].at.Before(top.t) {
			return false
		}
		heap.Pop(&r.engines)
		w := r.workers[top.w]
		if top.version != w.version {
			continue
		}
		r.events++
		if r.queued == 0 && r.followers == nil {
			w.eng.AdvanceTo(g)
		} else {
			r.clock.now = top.t
			w.eng.AdvanceTo(top.t)
		}
		r.touch(top.w)
		r.drain()
	}
	return true
}

// touch re-schedules worker w's engine after anything changed it.
func (r *run) touch(w int) {
	vw := r.workers[w]
	vw.version++
	vw.touched = true
	if !vw.watched {
		vw.watched = true
		r.watch = append(r.watch, w)
	}
	if t, ok := vw.eng.NextEvent(); ok {
		heap.Push(&r.engines, engineEntry{t: t, w: w, version: vw.version})
	}
}

func (r *run) push(e pendingEvent) {
	r.pseq++
	e.seq = r.pseq
	heap.Push(&r.pending, e)
}

// drain handles pending callbacks in time order; handling one may add more.
func (r *run) drain() {
	for len(r.pending) > 0 {
		e := heap.Pop(&r.pending).(pendingEvent)
		if e.at.After(r.clock.now) {
			r.clock.now = e.at
		}
		switch e.kind {
		case pBound:
			r.bound(e.req)
		case pRefused:
			r.refused(e.req)
		case pFirst:
			r.reqs[e.req].first = e.at
		case pDone:
			r.finished(e.req, e.at, e.res)
		}
	}
}

func (r *run) arrive(i int, now time.Time) {
	rq := &r.reqs[i]
	req := scheduler.Request{Model: r.cfg.Model, PromptTokens: rq.item.PromptTokens, MaxTokens: max(1, rq.item.OutputTokens), Attempt: 1, Prefix: rq.item.Prefix}
	if r.kv != nil {
		req.KVBlocks = r.kv.blocks(rq.item.Prefix, rq.item.PrefixBlockTokens)
		rq.kvBlocks = req.KVBlocks
	}
	if s := rq.item.Session; s != "" {
		req.Session, req.SessionSource = s, "header x-session-id"
		if r.cfg.FairShareBySession {
			req.Flow = s
		}
	}
	t := r.sched.Submit(req, func(t *scheduler.Ticket) {
		kind := pRefused
		if l, _ := t.Result(); l != nil {
			kind = pBound
		}
		r.push(pendingEvent{at: r.clock.now, kind: kind, req: i})
	})
	rq.ticket = t
	if !t.Done() {
		rq.inQueue = true
		r.queued++
		r.timeouts = append(r.timeouts, i)
	}
}

func (r *run) nextTimeout() (time.Time, bool) {
	for r.toHead < len(r.timeouts) {
		rq := &r.reqs[r.timeouts[r.toHead]]
		if rq.ticket.Done() {
			r.toHead++
			continue
		}
		return r.t0.Add(rq.item.At).Add(r.cfg.QueueTimeout), true
	}
	if r.toHead > 0 && r.toHead == len(r.timeouts) {
		r.timeouts, r.toHead = r.timeouts[:0], 0
	}
	return time.Time{}, false
}

func (r *run) timeout(now time.Time) {
	i := r.timeouts[r.toHead]
	r.toHead++
	r.sched.Cancel(r.reqs[i].ticket, scheduler.ErrQueueTimeout)
}

// bound submits a request to the engine its lease names.
func (r *run) bound(i int) {
	rq := &r.reqs[i]
	r.leaveQueue(rq)
	l, _ := rq.ticket.Result()
	rq.lease = l
	rq.bound = r.clock.now
	w := r.byName[l.Worker]
	rq.worker = w
	res := &r.results[i]
	res.Worker = l.Worker
	res.QueueMs = float64(l.QueueWait) / float64(time.Millisecond)
	vw := r.workers[w]
	if r.kv != nil && len(rq.kvBlocks) > 0 {
		r.expected += r.kv.expect(l.Worker, rq.kvBlocks, rq.item.PrefixBlockTokens, rq.item.PromptTokens)
	} else {
		r.expected += int64(l.ExpectedCachedTokens())
	}
	if r.onBind != nil {
		r.onBind(i, l)
	}
	sr := sim.Request{PromptTokens: rq.item.PromptTokens, MaxTokens: max(1, rq.item.OutputTokens), IgnoreEOS: true, Prefix: rq.item.Prefix, PrefixBlockTokens: rq.item.PrefixBlockTokens}
	_, err := vw.eng.Submit(r.clock.now, sr, sim.Callbacks{
		OnFirstToken: func(at time.Time) { r.push(pendingEvent{at: at, kind: pFirst, req: i}) },
		OnDone:       func(at time.Time, res sim.Result) { r.push(pendingEvent{at: at, kind: pDone, req: i, res: res}) },
	})
	r.touch(w)
	if err != nil {
		// The simulated llama-server answers 400 exceed_context_size_error.
		res.Status, res.Kind, res.Err = http.StatusBadRequest, bench.KindHTTP, fmt.Sprintf("worker %s: %v", l.Worker, err)
		res.E2E = r.clock.now.Sub(r.t0.Add(rq.item.At))
		res.TTFT = res.E2E
		rq.ended = true
		l.Release()
		r.ended(i, r.clock.now)
	}
}

// leaveQueue uncounts a request that waited in the scheduler's queue.
func (r *run) leaveQueue(rq *request) {
	if rq.inQueue {
		rq.inQueue = false
		r.queued--
	}
}

func (r *run) refused(i int) {
	rq := &r.reqs[i]
	_, err := rq.ticket.Result()
	r.leaveQueue(rq)
	res := &r.results[i]
	var ref *scheduler.Refusal
	if errors.As(err, &ref) {
		res.Reason = ref.Reason
		res.RetryAfter = strconv.Itoa(int((ref.RetryAfter + time.Second - 1) / time.Second))
		res.QueueMs = float64(ref.QueueWait) / float64(time.Millisecond)
	}
	res.Status = proxy.StatusOf(err)
	res.Kind = bench.KindHTTP
	if res.Status == http.StatusTooManyRequests || res.Status == http.StatusServiceUnavailable {
		res.Kind = bench.KindRefused
	}
	res.Err = fmt.Sprintf("%d %s: %v", res.Status, http.StatusText(res.Status), err)
	res.E2E = r.clock.now.Sub(r.t0.Add(rq.item.At))
	res.TTFT = res.E2E
	rq.ended = true
	r.ended(i, r.clock.now)
}

// finished records a request the engine completed and releases its lease.
func (r *run) finished(i int, at time.Time, sr sim.Result) {
	rq := &r.reqs[i]
	arrival := r.t0.Add(rq.item.At)
	res := &r.results[i]
	res.Status = http.StatusOK
	res.OutputTokens = sr.CompletionTokens
	res.CachedTokens = sr.CachedTokens
	res.E2E = at.Sub(arrival)
	first := rq.first
	if first.IsZero() {
		first = at
	}
	res.TTFT = first.Sub(arrival)
	obs := stats.Observation{TTFT: first.Sub(rq.bound), E2E: at.Sub(rq.bound), OutputTokens: sr.CompletionTokens,
		CachedTokens: sr.CachedTokens, CachedKnown: true}
	if res.OutputTokens >= 2 && res.E2E > res.TTFT {
		decode := res.E2E - res.TTFT
		res.TPOT = decode / time.Duration(res.OutputTokens-1)
		res.DecodeRate = float64(res.OutputTokens-1) / decode.Seconds()
		obs.DecodeTPS = res.DecodeRate
	}
	rq.ended = true
	r.clock.now = at
	rq.lease.Complete(obs, r.tracker, at) // as the proxy ends an answered request
	r.ended(i, at)
}

// scrape publishes fresh telemetry of every worker that may have changed.
func (r *run) scrape(now time.Time) {
	kick := false
	keep := r.watch[:0]
	for _, w := range r.watch {
		vw := r.workers[w]
		m := vw.eng.Metrics(now)
		old := vw.src.Snapshot()
		snap := snapshotOf(vw, m, now)
		if old.Health != snap.Health {
			kick = true
		}
		vw.src.p.Store(snap)
		idle := m.RequestsProcessing == 0 && m.RequestsDeferred == 0 && m.GPUUtilization == 0 && m.Ready
		if vw.touched || !idle {
			keep = append(keep, w)
		} else {
			vw.watched = false
		}
		vw.touched = false
	}
	r.watch = keep
	r.loads = r.loads[:0]
	for _, vw := range r.workers {
		m := vw.eng.Metrics(now)
		r.loads = append(r.loads, m.RequestsProcessing+m.RequestsDeferred)
	}
	r.balance.observe(r.loads)
	if now.Equal(r.t0) {
		// The first round: every worker is scraped once.
		for w, vw := range r.workers {
			if !vw.watched {
				m := vw.eng.Metrics(now)
				vw.src.p.Store(snapshotOf(vw, m, now))
				vw.watched, vw.touched = true, false
				r.watch = append(r.watch, w)
			}
		}
		kick = true
	}
	// With requests waiting, a scrape tick is also when a router would
	// notice that they have waited long enough for workers to borrow
	// over their learned limits (scheduler.Admit's step timer).
	if kick || r.queued > 0 {
		r.sched.Kick()
	}
}

const (
	srcQueue = "llamacpp /metrics llamacpp:requests_deferred"
	srcKV    = "llamacpp /metrics llamacpp:kv_cache_usage_ratio"
	srcGPU   = "dcgm /metrics DCGM_FI_DEV_GPU_UTIL"
)

func snapshotOf(vw *vworker, m sim.Metrics, now time.Time) *snapshot.Snapshot {
	h := snapshot.HealthOK
	if !m.Ready {
		h = snapshot.HealthLoading
	}
	p := vw.eng.Params()
	return &snapshot.Snapshot{
		Health:     h,
		Models:     []string{p.Model},
		Slots:      p.Slots,
		QueueLen:   snapshot.Reading{Value: float64(m.RequestsDeferred), Source: srcQueue, At: now},
		KVPressure: snapshot.Reading{Value: m.KVCacheUsageRatio, Source: srcKV, At: now},
		GPUUtil:    snapshot.Reading{Value: m.GPUUtilization, Source: srcGPU, At: now},
		// The engine's one KV cache, shared by its slots: what the HTTP
		// simulator's /slots n_ctx and /metrics tell the fleet (see
		// fleet's llama.cpp scrape).
		KVCacheTokens: p.KVTokens,
		KVPoolTokens:  p.KVTokens,
	}
}
