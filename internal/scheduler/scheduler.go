// Package scheduler decides which worker serves each request, and when.
//
// It scores every eligible worker (healthy, serving the model, under its
// max_concurrency) with a weighted sum of terms — active requests dominate,
// throughput is a reward, KV pressure and GPU load are visible — and the
// lowest score wins. When no worker has room the request waits in a bounded
// per-model queue, in priority and fair-share order (see queue), and is
// bound to whichever worker frees first (late binding). Picking and reserving are one step under one lock,
// so four requests arriving together at four idle workers land one per
// worker, with no randomness: ties go to the least recently picked worker,
// then to the worker listed first.
//
// The package is pure: no HTTP, no network call under its lock, time from
// a Clock. The HTTP router calls the blocking Admit; the virtual-time
// simulation calls Submit and Cancel and drives time itself.
//
// # Concurrency Model
//
// A Scheduler is safe for concurrent use. One mutex guards all admission
// state: per-worker in-flight counts and outstanding cost, the queues, the
// drain rates, the output estimator and the pick sequence. Telemetry is read from each worker's Source, which
// returns an immutable snapshot without blocking, and measured averages
// from a StatsReader; neither is written here. Callbacks (Recorder, a
// ticket's notify) run after the lock is released.
//
// With a shared Ledger (replicas on Redis) the ledger's calls are network
// round trips and are made outside the lock, in order per model, by one
// goroutine per model with calls pending (reserver.go). A pick that needs
// the ledger's answer holds its local choice (in-flight +1) and keeps the
// rest of its model waiting until the answer, handled under the lock,
// binds it, queues it or falls back to the local view. So with a Ledger
// a ticket may still be pending when Submit returns; Admit waits for it,
// and FlushLedger waits for every call queued so far.
//
// # Request Lifecycle and Ownership
//
// Submit creates a Ticket for a request of a priority class (the default
// when it names none; an unknown class is refused) and a tenant. If its
// model's queue is empty and a worker has room, the ticket is bound at
// once. Otherwise it is refused when waiting is pointless (nobody serves
// the model, or every worker that does is down), when the queue is full,
// or when the work queued ahead of it, at the rate the queue drains, would
// keep it waiting past twice its class's deadline (deadline_unmeetable);
// else it waits. Whenever a worker frees, the queue's head is placed:
// retries first; then the highest class, except that no request is
// overtaken by a higher class arriving more than MaxOvertake after it;
// within a class the tenant with the lowest start-time fair-queueing tag
// (shares by token cost and tenant weight); within a tenant arrival order,
// or cheapest first within MaxOvertake with ShortestFirst.
//
// A ticket ends exactly once: bound to a Lease or refused with a *Refusal.
// Cancel refuses a ticket only if it is still queued and reports whether
// it did; if the ticket was bound first, its lease belongs to the caller,
// who must Release it. A queued ticket is also refused when the fleet
// changes (Kick, SetDraining, RemoveWorker) so that nobody left can serve
// it. Lease.Observe, before Release, tells the scheduler how many tokens
// the answer produced: it teaches the output estimate and the drain rate.
// Releasing the lease is the only way a reservation is given back, and
// Release is idempotent. A model's queue exists only while requests wait.
package scheduler

import (
	"cmp"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/stats"
)

// Policy selects how a worker is chosen. PolicySluice scores and queues;
// the others are the baselines people use today, built in so a benchmark
// compares policies and nothing else. Baselines neither queue nor respect
// max_concurrency, as nginx and HAProxy do not.
type Policy string

// The routing policies.
const (
	PolicySluice           Policy = "sluice"
	PolicyRoundRobin       Policy = "round-robin"
	PolicyLeastConnections Policy = "least-connections"
	PolicyRandom           Policy = "random"
	PolicyPowerOfTwo       Policy = "p2c"
)

// Policies lists every policy, Sluice's first.
var Policies = []Policy{PolicySluice, PolicyRoundRobin, PolicyLeastConnections, PolicyRandom, PolicyPowerOfTwo}

// StatsReader gives the measured averages of a worker: an immutable value,
// or nil when there are none. *stats.Tracker is one.
type StatsReader interface {
	Stats(worker string) *stats.WorkerStats
}

// Config configures a Scheduler.
type Config struct {
	// Weights of the score terms; used when Terms is nil.
	Weights Weights
	// Terms overrides the score terms (and their weights).
	Terms []WeightedTerm
	// MaxQueue bounds each model's queue; 0 refuses whenever no worker
	// has room.
	MaxQueue int
	// QueueTimeout bounds a request's wait in Admit.
	QueueTimeout time.Duration
	// StaleAfter marks telemetry older than this as stale in records.
	StaleAfter time.Duration
	// Policy selects the routing policy; empty means PolicySluice.
	Policy Policy
	// DefaultOutputTokens is the expected output length of a request
	// before any output of its model has been observed (and when
	// max_tokens is unset); 256 when zero.
	DefaultOutputTokens int
	// Classes are the priority classes, the first the default for a
	// request that names none; DefaultClasses when empty.
	Classes []Class
	// TenantWeights are the fair-share weights of tenants; a tenant not
	// listed weighs 1.
	TenantWeights map[string]float64
	// MaxOvertake is the aging bound of the queue order: no request is
	// bound before a waiting one that arrived more than MaxOvertake
	// earlier, unless it is a retry or of the same class and another
	// tenant (fair share decides there). Prefix affinity under a backlog
	// overtakes within it too (affinity.go). DefaultMaxOvertake when 0.
	MaxOvertake time.Duration
	// ShortestFirst orders each tenant's requests cheapest first (by
	// expected tokens), bounded by MaxOvertake; otherwise they go in
	// arrival order. Off by default: on the Azure conversation trace in
	// virtual time it raised p99 TTFT (see docs/routing.md, Priorities and fair
	// share).
	ShortestFirst bool
	// KVFit turns on the KV-fit rule (kvfit.go): a worker whose shared KV
	// cache cannot take the request's prompt now is passed over, and the
	// request waits in the queue rather than inside a worker when none
	// can. The zero Config leaves it off; the router's configuration
	// (admission.kv_fit) turns it on by default: with the simulators'
	// chunked prefill it shortened p99 TTFT on most rows of the virtual
	// benchmarks, at a cost on a few (docs/benchmarks.md, KV fit).
	KVFit bool
	// Seed seeds the random baselines; Sluice's own policy uses no
	// randomness.
	Seed uint64
	// Clock tells the time; WallClock when nil.
	Clock Clock
	// Stats supplies measured averages; nil means none.
	Stats StatsReader
	// Recorder receives every decision record, outside the lock.
	Recorder func(*decisions.Record)
	// NoRecords skips building decision records: for virtual-time runs
	// over thousands of workers that nobody will ask "why" about. Leases
	// then have no Decision and refusals no DecisionID. It cannot be
	// combined with a Recorder.
	NoRecords bool
	// PrefixIndex, when set, tells how much of a request's prompt prefix
	// each worker is expected to hold (the prefix term) and learns where
	// each request went.
	PrefixIndex PrefixIndex
	// IDPrefix starts every decision ID; when empty, the start time and a
	// random part, so IDs stay unique across restarts and between replicas
	// started together.
	IDPrefix string
	// Ledger, when set, shares reservations with other replicas (see
	// ledger.go); nil schedules this process's requests alone.
	Ledger Ledger
	// Limits configures adaptive per-worker concurrency (see LimitConfig).
	Limits LimitConfig
}

// WorkerSpec describes a worker to the scheduler.
type WorkerSpec struct {
	// Name identifies the worker.
	Name string
	// Models the worker serves according to its config, used until its
	// Source reports discovered models.
	Models []string
	// MaxConcurrency caps Sluice's in-flight requests on the worker; 0
	// takes the worker's reported slot count, else LimitConfig.DefaultCap
	// (1 with learning off). Below the cap the limit is learned unless
	// LimitConfig.Fixed.
	MaxConcurrency int
	// Source publishes the worker's telemetry; nil means healthy with no
	// telemetry.
	Source Source
}

// Request is what the scheduler needs to know of a request.
type Request struct {
	// Model is the requested model.
	Model string
	// PromptTokens is the estimated prompt size in tokens.
	PromptTokens int
	// PromptSource says where PromptTokens came from, e.g. "estimate:
	// text/4" or "worker /tokenize"; kept in the decision record.
	PromptSource string
	// MaxTokens is the request's output cap; 0 when unset.
	MaxTokens int
	// Exclude names workers that already failed this request.
	Exclude []string
	// Attempt is 1 for a new request; a retry passes the next number and
	// goes to the front of the queue: it was accepted before the others.
	Attempt int
	// Tenant names who sent the request (from its API key); fair share is
	// kept between tenants. Empty is the anonymous tenant.
	Tenant string
	// Class is the request's priority class (e.g. "interactive",
	// "batch"); empty takes the default class.
	Class string
	// Prefix holds the chained block hashes of the prompt (see package
	// prefix): hash i covers blocks 0..i. Empty when unknown.
	Prefix []uint64
}

// Scheduler admits requests to workers. See the package doc.
type Scheduler struct {
	cfg      Config
	limits   *LimitConfig // immutable: records keep it to explain limits
	statsVia statsVia     // cfg.Stats, when it reads through handles
	terms    []WeightedTerm
	clock    Clock
	prefix   string
	closing  atomic.Bool

	classes  []Class // in priority order
	defClass int     // index of the default class
	order    order

	mu      sync.Mutex
	workers []*worker // in configuration order
	byName  map[string]*worker
	queues  map[string]*queue     // only models with requests waiting
	rates   map[string]*drainRate // drain rates of served models
	est     estimator
	seq     uint64 // tickets submitted
	picks   uint64 // reservations made
	ids     uint64 // decision records made
	rr      uint64 // round-robin position
	rng     *rand.Rand
	scratch scratch
	idxBuf  []int
	candBuf []Candidate
	eligBuf []*worker
	affBuf  []*worker // workers with room for one stream more (affinity.go)
	// behindBuf holds the requests that may overtake the head (affinity.go).
	behindBuf []*Ticket
	closed    bool
	changed   chan struct{} // closed at the next state change; nil when nobody waits
	shared    ledgerState
	// ledger makes cfg.Ledger's calls outside the lock (reserver.go); nil
	// without one. reserving holds, per model, the pick waiting for its
	// answer: no other request of the model is placed meanwhile.
	ledger    *ledgerRunner
	reserving map[string]*reservation
	// prefixWeighted says the prefix term counts: a PrefixIndex is set and
	// the term's weight is not 0. Otherwise no pick asks the index.
	prefixWeighted bool

	// kvHeld says that the latest pick found no worker because the KV-fit
	// rule passed over every eligible one (kvfit.go).
	kvHeld bool
}

type worker struct {
	spec   WorkerSpec
	order  int
	active int
	// pickLimit is the limit the latest pick computed for the worker.
	pickLimit int
	cost      float64
	draining  bool
	removed   bool
	lastPick  uint64
	last      *decisions.Record // the latest decision that scored it
	lastIdx   int               // its index among last's candidates
	statsAt   stats.Handle      // where its stats are, for statsOf

	// What the latest pick resolved of the worker, once per pick (see
	// pickLocked). They are not cleared after it, as the candidate buffer
	// is not: clearing costs a write per worker on every pick, and what
	// they keep alive until the next is only the snapshot and stats the
	// worker last published.
	snap    *Snapshot
	st      *stats.WorkerStats
	lim     limitState
	why     uint8 // one of the why* reasons of (in)eligibility
	serving bool  // it serves the requested model
	// prefixKV is the KV cache size (tokens) last passed to the prefix
	// index's PrefixCapacity, so it is told only of changes.
	prefixKV int

	// Above, what a pick reads and writes of every worker, together in
	// as few cache lines as may be; below, what it reads of a few or
	// little of (moved: one line, when limits are learned).

	// remote is the other replicas' requests in flight on the worker as
	// the shared ledger last said (0 without one): the level a stream
	// runs at is the worker's, not this replica's share of it.
	remote int
	busy   busy // integral of active+remote over time
	// moved is the latest change of the learned limit.
	moved limitMove
}

func (w *worker) snapshot() *Snapshot {
	if w.spec.Source == nil {
		return &emptySnapshot
	}
	if s := w.spec.Source.Snapshot(); s != nil {
		return s
	}
	return &emptySnapshot
}

var emptySnapshot Snapshot

func (w *worker) models(s *Snapshot) []string {
	if s.Models != nil {
		return s.Models
	}
	return w.spec.Models
}

func (w *worker) serves(s *Snapshot, model string) bool {
	return slices.Contains(w.models(s), model)
}

// New returns a Scheduler with the given workers.
func New(cfg Config, workers ...WorkerSpec) (*Scheduler, error) {
	if cfg.Policy == "" {
		cfg.Policy = PolicySluice
	}
	if !slices.Contains(Policies, cfg.Policy) {
		return nil, fmt.Errorf("scheduler: unknown policy %q", cfg.Policy)
	}
	if cfg.NoRecords && cfg.Recorder != nil {
		return nil, fmt.Errorf("scheduler: NoRecords with a Recorder: the recorder would receive nothing")
	}
	if cfg.DefaultOutputTokens <= 0 {
		cfg.DefaultOutputTokens = 256
	}
	if cfg.Clock == nil {
		cfg.Clock = WallClock{}
	}
	if cfg.MaxOvertake == 0 {
		cfg.MaxOvertake = DefaultMaxOvertake
	}
	if err := checkClasses(cfg.Classes); err != nil {
		return nil, err
	}
	classes, def := sortClasses(cfg.Classes)
	s := &Scheduler{
		classes:  classes,
		defClass: def,
		order:    order{overtake: cfg.MaxOvertake, costOvertake: -1},
		rates:    map[string]*drainRate{},
		est:      estimator{def: cfg.DefaultOutputTokens},
		cfg:      cfg,
		limits:   new(cfg.Limits.withDefaults()),
		terms:    cfg.Terms,
		clock:    cfg.Clock,
		prefix:   cfg.IDPrefix,
		byName:   map[string]*worker{},
		queues:   map[string]*queue{},
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed)),
	}
	if s.terms == nil {
		s.terms = DefaultTerms(cfg.Weights)
	}
	s.statsVia, _ = cfg.Stats.(statsVia)
	if cfg.ShortestFirst {
		s.order.costOvertake = cfg.MaxOvertake
	}
	if s.prefix == "" {
		// The start time keeps IDs apart across restarts, the random part
		// across replicas started in the same millisecond. (Randomness in
		// a name, never in a decision.)
		var b [4]byte
		crand.Read(b[:])
		s.prefix = strconv.FormatInt(cfg.Clock.Now().UnixMilli(), 36) + hex.EncodeToString(b[:])
	}
	if cfg.Ledger != nil {
		s.ledger, s.reserving = newLedgerRunner(s, cfg.Ledger), map[string]*reservation{}
	}
	if cfg.PrefixIndex != nil {
		for _, wt := range s.terms {
			if wt.Term.Name() == (prefixMatch{}).Name() && wt.Weight != 0 {
				s.prefixWeighted = true
			}
		}
	}
	for _, w := range workers {
		if err := s.AddWorker(w); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Policy returns the policy in use.
func (s *Scheduler) Policy() Policy { return s.cfg.Policy }

// AddWorker adds a worker and places any queued requests it can take.
func (s *Scheduler) AddWorker(spec WorkerSpec) error {
	s.mu.Lock()
	if _, ok := s.byName[spec.Name]; ok {
		s.mu.Unlock()
		return fmt.Errorf("scheduler: worker %q already exists", spec.Name)
	}
	w := &worker{spec: spec, order: len(s.workers)}
	s.workers = append(s.workers, w)
	s.byName[spec.Name] = w
	done := s.dispatchLocked()
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return nil
}

// RemoveWorker stops sending requests to a worker and forgets it. Requests
// in flight on it keep their leases and finish normally; queued requests
// that nobody left can serve are refused.
func (s *Scheduler) RemoveWorker(name string) error {
	s.mu.Lock()
	w, ok := s.byName[name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("scheduler: no worker %q", name)
	}
	w.removed = true
	delete(s.byName, name)
	s.workers = slices.DeleteFunc(s.workers, func(x *worker) bool { return x == w })
	for i, x := range s.workers {
		x.order = i
	}
	done := s.sweepLocked(nil)
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return nil
}

// SetDraining stops (or resumes) new requests to a worker; requests in
// flight finish normally, queued requests that no other worker can serve
// are refused.
func (s *Scheduler) SetDraining(name string, draining bool) error {
	s.mu.Lock()
	w, ok := s.byName[name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("scheduler: no worker %q", name)
	}
	w.draining = draining
	done := s.sweepLocked(s.dispatchLocked())
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return nil
}

// UpdateWorker replaces a worker's settings — models, max_concurrency,
// telemetry source — in place. Its requests in flight, their reserved
// cost and what was learned of it stay, so a config reload that changes a
// worker cannot admit a fresh full batch while the old leases still run.
func (s *Scheduler) UpdateWorker(spec WorkerSpec) error {
	s.mu.Lock()
	w, ok := s.byName[spec.Name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("scheduler: no worker %q", spec.Name)
	}
	w.spec = spec
	done := s.sweepLocked(s.dispatchLocked())
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return nil
}

// Kick places queued requests that have become placeable for reasons the
// scheduler cannot see itself: a worker turned healthy, loaded a model, or
// reported more slots. It also refuses those that can no longer be served:
// every worker of their model went down, or discovery showed that nobody
// serves it. The fleet calls it when a snapshot changes.
func (s *Scheduler) Kick() {
	s.mu.Lock()
	done := s.sweepLocked(s.dispatchLocked())
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
}

// Close refuses every queued request with ErrClosed and every later one.
func (s *Scheduler) Close() {
	s.closing.Store(true)
	s.mu.Lock()
	s.closed = true
	var done []*Ticket
	for _, q := range s.queues {
		q.each(func(t *Ticket) { done = append(done, t) })
	}
	clear(s.queues)
	for _, t := range done {
		s.sharedGoneLocked(t)
	}
	for _, res := range s.reserving {
		if !res.t.queued && !res.gone { // a new request waiting for the ledger
			done = append(done, res.t)
		}
	}
	for _, t := range done {
		s.refuseLocked(t, ErrClosed, "shutting down")
	}
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	if s.ledger != nil {
		s.ledger.wait() // the calls queued so far, the Unwaits above among them
	}
}

// Changed returns a channel that is closed at the next change of admission
// state: a request queued, bound, refused or released, a worker added,
// drained or removed. Live views and tests wait on it instead of polling.
func (s *Scheduler) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *Scheduler) notifyLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// Ticket is one request's place in admission. See the package doc.
type Ticket struct {
	req    Request
	seq    uint64
	front  bool
	enq    time.Time
	depth  int
	notify func(*Ticket)
	done   chan struct{}
	cls    int     // index of its class in Scheduler.classes
	cost   float64 // expected tokens: prompt plus expected output
	hidx   int     // index in its flow's cost heap; -1 when in none

	// res is the reservation the ledger is making for it, if any;
	// waiting says it is on the shared ledger's waiting list.
	res     *reservation
	waiting bool

	// Set once, under the scheduler's lock, before done is closed.
	lease  *Lease
	err    error
	rec    *decisions.Record
	queued bool
}

// Done reports whether the ticket has ended (bound or refused).
func (t *Ticket) Done() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Wait returns a channel closed when the ticket ends.
func (t *Ticket) Wait() <-chan struct{} { return t.done }

// Result returns the lease or the refusal; valid once Done.
func (t *Ticket) Result() (*Lease, error) { return t.lease, t.err }

// Lease is a reservation of one slot on a worker. Release gives it back.
type Lease struct {
	s        *Scheduler
	w        *worker
	cost     float64
	model    string
	shared   string // the Ledger's lease, "" without one
	req      Request
	out      int // output tokens observed; -1 until Observe
	released atomic.Bool

	// Worker is the chosen worker's name.
	Worker string
	// Limit is the worker's concurrency limit when the lease was made
	// (its decision record says why).
	Limit      int
	bound      time.Time // when the lease was made
	busyAtBind float64   // the worker's busy integral then
	// Decision is the record of the decision that made this lease.
	Decision *decisions.Record
	// QueueWait is how long the request waited for the lease.
	QueueWait time.Duration
}

// Release gives the slot back and places the next queued request. Calling
// it more than once has no further effect.
func (l *Lease) Release() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	s := l.s
	now := s.clock.Now()
	s.mu.Lock()
	done := s.releaseLocked(l, now)
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
}

// releaseLocked gives l's slot back and places the queued requests that
// can now go, returning the tickets that ended for s.finish. The caller
// has won l.released and holds s.mu.
func (s *Scheduler) releaseLocked(l *Lease, now time.Time) []*Ticket {
	// The shared slot first: the dispatch below asks the ledger, which
	// must already count it free, or this replica's own queue could not
	// take the slot it just freed and would wait for the wake-up. The
	// model's ledger calls are made in order.
	s.sharedReleaseLocked(l)
	l.w.busy.move(l.w.inFlight(), now)
	l.w.active--
	l.w.cost -= l.cost
	if l.w.active == 0 {
		l.w.cost = 0 // no float drift on an idle worker
	}
	s.drainedLocked(l, now)
	return s.dispatchLocked()
}

// Submit enters a request into admission. If a worker can take it now the
// returned ticket is already bound; otherwise it waits in the model's queue
// or is refused. notify, if not nil, is called exactly once when the ticket
// ends, outside the scheduler's lock (possibly before Submit returns).
func (s *Scheduler) Submit(req Request, notify func(*Ticket)) *Ticket {
	if req.Attempt == 0 {
		req.Attempt = 1
	}
	now := s.clock.Now()
	t := &Ticket{req: req, enq: now, notify: notify, done: make(chan struct{}), front: req.Attempt > 1, hidx: -1}
	s.mu.Lock()
	s.seq++
	t.seq = s.seq
	done := s.submitLocked(t, now)
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return t
}

func (s *Scheduler) submitLocked(t *Ticket, now time.Time) []*Ticket {
	if s.closed {
		s.refuseLocked(t, ErrClosed, "shutting down")
		return []*Ticket{t}
	}
	cls, ok := s.classOf(t.req.Class)
	if !ok {
		_, rec := s.pickLocked(t.req, now, true)
		names := make([]string, len(s.classes))
		for i, c := range s.classes {
			names[i] = c.Name
		}
		s.refuseWithLocked(t, rec, fmt.Errorf("%w %q (configured: %s)", ErrUnknownClass, t.req.Class, strings.Join(names, ", ")))
		return []*Ticket{t}
	}
	t.cls, t.req.Class = cls, s.classes[cls].Name
	t.cost = s.expectedCost(nil, t.req)
	q := s.queues[t.req.Model]
	// A new request may only jump the queue when nobody of its model is
	// waiting (a retry was accepted earlier and goes first), nor waiting
	// for the shared ledger's answer.
	mayJump := q == nil || t.front || s.cfg.Policy != PolicySluice
	if mayJump && s.reserving[t.req.Model] != nil {
		// It waits only for the answer to another request of its model:
		// it asks the ledger next, and goes on the shared waiting list
		// only if the ledger has no room for it then.
		return s.queueLocked(t, now, false)
	}
	if mayJump {
		if w, rec := s.pickLocked(t.req, now, false); w != nil {
			if s.shared.pending != nil {
				s.startReserveLocked(t, w, rec)
				return nil
			}
			s.bindLocked(t, w, rec, now)
			return []*Ticket{t}
		} else if s.cfg.Policy != PolicySluice {
			_, rec = s.pickLocked(t.req, now, true)
			s.refuseWithLocked(t, rec, s.unplaceable(t.req))
			return []*Ticket{t}
		}
	}
	return s.queueLocked(t, now, true)
}

// queueLocked puts t in its model's queue, or refuses it when waiting is
// pointless, the queue is full or its deadline cannot be met; then it
// places what can be placed. shared puts it on the shared ledger's
// waiting list too.
func (s *Scheduler) queueLocked(t *Ticket, now time.Time, shared bool) []*Ticket {
	q := s.queues[t.req.Model]
	if q != nil {
		t.depth = q.n
	}
	why, spec := s.admissibleLocked(t.req)
	var retryAfter time.Duration
	switch {
	case why != nil:
	case t.depth >= s.cfg.MaxQueue && !t.front:
		why = ErrQueueFull
	case spec && q == nil && s.speculativeLocked() >= s.cfg.MaxQueue:
		// Requests for models nobody is known to serve yet share one
		// budget: client-supplied names must not grow state unbounded.
		why = ErrQueueFull
	case !t.front:
		if wait, ok := s.predictedWaitLocked(q, t); ok && wait > deadlineMargin*s.maxWait(t.req.Class) {
			why, retryAfter = ErrDeadlineUnmeetable, wait-s.maxWait(t.req.Class)
		}
	}
	if why != nil {
		_, rec := s.pickLocked(t.req, now, true)
		s.refuseWithLocked(t, rec, why)
		if retryAfter > 0 {
			t.err.(*Refusal).RetryAfter = clampRetryAfter(retryAfter)
		}
		return []*Ticket{t}
	}
	if q == nil {
		q = newQueue(len(s.classes), now)
		q.spec = spec
		s.queues[t.req.Model] = q
	}
	t.queued = true
	q.push(t, s.weightOf(t.req.Tenant))
	if shared {
		s.sharedQueuedLocked(t)
	}
	// Placing waits behind the queue, but the queue may be held only by
	// retries that excluded the free workers.
	return s.dispatchLocked()
}

// deadlineMargin is how far past its class's deadline a request's
// predicted wait must be before it is refused at once. The prediction is
// noisy: in the virtual-time simulation at 90% of capacity (vsim's
// synthetic load of TestCapacity_ScalesWithSpeedAndSlots), requests
// predicted to wait 20-30 s waited 17-19 s on average. Refusing at twice
// the deadline sheds load that would time out while keeping work that
// would have made it.
const deadlineMargin = 2

// predictedWaitLocked predicts how long t would wait in q: the work that
// would be bound before it over the model's drain rate. It reports false
// while the drain rate is unmeasured.
func (s *Scheduler) predictedWaitLocked(q *queue, t *Ticket) (time.Duration, bool) {
	r := s.rates[t.req.Model]
	if r == nil || !r.rate.Known() || r.rate.Value <= 0 {
		return 0, false
	}
	if q == nil {
		return 0, true
	}
	return time.Duration(q.ahead(t, s.weightOf(t.req.Tenant)) / r.rate.Value * float64(time.Second)), true
}

// speculativeLocked counts the requests waiting for models no worker was
// known to serve when they came.
func (s *Scheduler) speculativeLocked() int {
	n := 0
	for _, q := range s.queues {
		if q.spec {
			n += q.n
		}
	}
	return n
}

// unplaceable names the refusal for a request no worker can take now
// under a baseline policy.
func (s *Scheduler) unplaceable(req Request) error {
	if err := s.whyNotWaitLocked(req); err != nil {
		return err
	}
	return ErrNoHealthyWorker
}

// whyNotWaitLocked returns the error that makes waiting pointless: no
// worker serves the model, or none that does could ever take this request
// (all down, draining or already failed it). Loading workers count as
// coming: capacity is a model loaded on a card, and it is on its way.
func (s *Scheduler) whyNotWaitLocked(req Request) error {
	err, _ := s.admissibleLocked(req)
	return err
}

// admissibleLocked is whyNotWaitLocked that also reports whether waiting
// is speculative: no worker is known to serve the model, but some
// worker's models are still being discovered.
func (s *Scheduler) admissibleLocked(req Request) (err error, speculative bool) {
	serves, undiscovered, fits := false, false, false
	for _, w := range s.workers {
		snap := w.snapshot()
		if snap.Models == nil && len(w.spec.Models) == 0 && snap.Health != HealthDown {
			undiscovered = true // its models are not known yet: it may serve this one
		}
		if !w.serves(snap, req.Model) {
			continue
		}
		serves = true
		if tooLong(snap, req) {
			continue
		}
		fits = true
		if snap.Health != HealthDown && !w.draining && !slices.Contains(req.Exclude, w.spec.Name) {
			return nil, false
		}
	}
	switch {
	case undiscovered:
		return nil, !serves
	case !serves:
		return ErrUnknownModel, false
	case !fits:
		return ErrPromptTooLong, false
	}
	return ErrNoHealthyWorker, false
}

// tooLong reports whether req's prompt cannot fit the worker's context
// (prompt plus completion per slot, when the worker reports it). The
// prompt size is an estimate, so only the prompt is held against it: a
// request the worker would surely refuse is not sent there.
func tooLong(snap *Snapshot, req Request) bool {
	return snap.ContextTokens > 0 && req.PromptTokens > snap.ContextTokens
}

// Cancel refuses t with cause (ErrQueueTimeout or ErrClientGone) if it is
// still queued, and reports whether it did. When it returns false the
// ticket has ended already; if it was bound, the caller owns the lease.
func (s *Scheduler) Cancel(t *Ticket, cause error) bool {
	now := s.clock.Now()
	s.mu.Lock()
	if !t.queued && t.res == nil {
		s.mu.Unlock()
		return false
	}
	if t.queued {
		s.unqueueLocked(t, false)
		s.sharedGoneLocked(t)
	}
	_, rec := s.pickLocked(t.req, now, true)
	s.refuseWithLocked(t, rec, cause)
	// The head may have changed: a retry blocked by its exclusions can
	// have been holding back requests that fit now.
	done := append(s.dispatchLocked(), t)
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return true
}

// unqueueLocked takes a queued ticket out of its model's queue (bound:
// to be served) and deletes the queue when it empties.
func (s *Scheduler) unqueueLocked(t *Ticket, bound bool) {
	q := s.queues[t.req.Model]
	q.remove(t, bound)
	if q.n == 0 {
		delete(s.queues, t.req.Model)
	}
}

// QueueDepth returns how many requests wait for model.
func (s *Scheduler) QueueDepth(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.queues[model]; ok {
		return q.n
	}
	return 0
}

// QueueDepths returns how many requests wait for each model: every model a
// worker serves (0 when none wait), and any other with requests waiting.
func (s *Scheduler) QueueDepths() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.queues))
	s.servedLocked(func(m string) { out[m] = 0 })
	for m, q := range s.queues {
		out[m] = q.n
	}
	return out
}

// QueueDepthsByClass returns, for the models of QueueDepths, how many
// requests wait in each priority class (retries counted in their class).
func (s *Scheduler) QueueDepthsByClass() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]int, len(s.queues))
	zero := func(m string) {
		by := make(map[string]int, len(s.classes))
		for _, c := range s.classes {
			by[c.Name] = 0
		}
		out[m] = by
	}
	s.servedLocked(zero)
	for m, q := range s.queues {
		if out[m] == nil {
			zero(m)
		}
		for i, cq := range q.classes {
			out[m][s.classes[i].Name] += cq.n
		}
		for _, t := range q.retries {
			out[m][s.classes[t.cls].Name]++
		}
	}
	return out
}

// servedLocked calls fn for every model some worker serves.
func (s *Scheduler) servedLocked(fn func(model string)) {
	for _, w := range s.workers {
		for _, m := range w.models(w.snapshot()) {
			fn(m)
		}
	}
}

// Classes returns the priority classes in priority order.
func (s *Scheduler) Classes() []Class { return slices.Clone(s.classes) }

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
		slices.SortFunc(heads, func(a, b head) int { return ticketOrder(a.t, b.t) })
		bound := false
		for _, h := range heads {
			if t, w, rec := s.placeableLocked(h.q, now); t != nil {
				if s.shared.pending != nil {
					s.startReserveLocked(t, w, rec)
					started = append(started, t.res)
				} else {
					s.unqueueLocked(t, true)
					s.bindLocked(t, w, rec, now)
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
		q.spec = q.spec && spec
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
		_, rec := s.pickLocked(t.req, now, true)
		s.refuseWithLocked(t, rec, cause)
		done = append(done, t)
	}
	return done
}

// placeableLocked returns the ticket of q that goes next if a worker can
// take it now. Tickets normally share one fate (same model, same eligible
// workers), so only the head is tried; a retry that excludes workers which
// failed it is skipped over, so it cannot hold back the requests behind
// it.
func (s *Scheduler) placeableLocked(q *queue, now time.Time) (*Ticket, *worker, *decisions.Record) {
	for _, t := range q.retries {
		if w, rec := s.pickQueuedLocked(t, now); w != nil {
			return t, w, rec
		}
		if len(t.req.Exclude) == 0 {
			return nil, nil, nil
		}
	}
	if t := q.next(s.order); t != nil {
		w, rec := s.pickQueuedLocked(t, now)
		held := s.kvHeld
		// A request behind the head may go first where its prefix is
		// cached, within the aging bound (see affinity.go).
		if u, uw, urec := s.affinityOvertakeLocked(q, t, w, now); u != nil {
			return u, uw, urec
		}
		if w != nil {
			return t, w, rec
		}
		if held { // the head's prompt fits no cache now (kvfit.go)
			return s.kvOvertakeLocked(q, t, now)
		}
	}
	return nil, nil, nil
}

// ticketOrder orders the heads of queues for placement: retries first,
// then by class, then by arrival.
func ticketOrder(a, b *Ticket) int {
	if a.front != b.front {
		if a.front {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.cls, b.cls); c != 0 {
		return c
	}
	return cmp.Compare(a.seq, b.seq)
}

// expectedCost estimates the tokens a request will keep a worker busy
// with: its prompt plus its expected output (output length is unknowable
// up front), capped by max_tokens. The output is the estimator's, learnt
// per model, tenant and prompt size; on a worker (w not nil) that has
// measured history, the worker's mean output stands in. w is nil for the
// queue's order and deadlines.
func (s *Scheduler) expectedCost(w *worker, req Request) float64 {
	out, _ := s.est.estimate(&req)
	if w != nil && s.cfg.Stats != nil {
		// Placing on a worker: its own measured mean output, when it has
		// one, weighs in the job-cost term as before the estimator (the
		// estimate there raised p99 TTFT in virtual time, see docs/routing.md).
		if st := s.cfg.Stats.Stats(w.spec.Name); st != nil && st.OutputTokens.Known() {
			out = st.OutputTokens.Value
			if req.MaxTokens > 0 {
				out = math.Min(out, float64(req.MaxTokens))
			}
		}
	}
	return float64(req.PromptTokens) + out
}

// Observe records that the lease's request produced outputTokens tokens;
// call it before Release for an answer that completed. The scheduler
// learns output lengths from it (see Config.DefaultOutputTokens) and
// measures its drain rate in the tokens actually produced.
func (l *Lease) Observe(outputTokens int) {
	if outputTokens < 0 || l.released.Load() {
		return
	}
	s := l.s
	s.mu.Lock()
	s.est.observe(&l.req, outputTokens)
	l.out = outputTokens
	s.mu.Unlock()
}

// drainedLocked accounts a released lease in its model's drain rate, if
// requests of the model are waiting.
func (s *Scheduler) drainedLocked(l *Lease, now time.Time) {
	q := s.queues[l.model]
	if q == nil {
		return // no backlog: an idle spell says nothing about the drain rate
	}
	d := s.rates[l.model]
	if d == nil {
		d = &drainRate{}
		s.rates[l.model] = d
	}
	work := l.cost
	if l.out >= 0 {
		work = float64(l.req.PromptTokens + l.out)
	}
	d.drained(work, q.since, now)
}

func (s *Scheduler) bindLocked(t *Ticket, w *worker, rec *decisions.Record, now time.Time) {
	cost := s.expectedCost(w, t.req)
	w.busy.move(w.inFlight(), now)
	w.active++
	w.cost += cost
	s.picks++
	w.lastPick = s.picks
	wait := now.Sub(t.enq)
	if rec != nil {
		rec.Outcome = "bound"
		rec.QueueWaitMs = float64(wait) / float64(time.Millisecond)
		rec.QueueDepth = t.depth
	}
	s.recordPrefixLocked(t.req, w)
	t.lease = &Lease{s: s, w: w, cost: cost, model: t.req.Model, req: t.req, out: -1, Worker: w.spec.Name, Decision: rec, QueueWait: wait,
		Limit: w.pickLimit, bound: now, busyAtBind: w.busy.integral}
	s.sharedBindLocked(t, t.lease)
	t.rec = rec
	t.queued = false
}

func (s *Scheduler) refuseWithLocked(t *Ticket, rec *decisions.Record, cause error) {
	if t.res != nil {
		t.res.gone = true // the ledger's answer gives back what it reserved
		t.res = nil
	}
	wait := s.clock.Now().Sub(t.enq)
	ref := &Refusal{Err: cause, Reason: reasonOf(cause), RetryAfter: s.retryAfterLocked(t), QueueWait: wait}
	if rec != nil {
		// The record's pick chose nobody for it: it reserves nothing, and
		// with a Ledger it saw only this replica's view, by which a worker
		// full across replicas looks free.
		rec.Chosen = ""
		rec.Outcome = ref.Reason
		rec.Reason = cause.Error()
		rec.QueueWaitMs = float64(wait) / float64(time.Millisecond)
		rec.QueueDepth = t.depth
		ref.DecisionID = rec.ID
	}
	t.rec = rec
	t.err = ref
	t.queued = false
}

func (s *Scheduler) refuseLocked(t *Ticket, cause error, reason string) {
	var rec *decisions.Record
	if !s.cfg.NoRecords {
		rec = s.newRecordLocked(t.req, s.clock.Now())
		rec.Reason = reason
	}
	s.refuseWithLocked(t, rec, cause)
}

// retryAfterLocked estimates when t would be served: the work waiting for
// its model plus its own over the model's drain rate, measured while
// requests waited. Without a measured rate it is the queue timeout.
func (s *Scheduler) retryAfterLocked(t *Ticket) time.Duration {
	d := s.cfg.QueueTimeout
	if r := s.rates[t.req.Model]; r != nil && r.rate.Known() && r.rate.Value > 0 {
		work := t.cost
		if q := s.queues[t.req.Model]; q != nil {
			work += q.work
		}
		d = time.Duration(work / r.rate.Value * float64(time.Second))
	}
	return clampRetryAfter(d)
}

// clampRetryAfter keeps a Retry-After between a second and ten minutes.
func clampRetryAfter(d time.Duration) time.Duration {
	return min(max(d, time.Second), 10*time.Minute)
}

// finish ends tickets outside the lock: records, then wake-ups.
func (s *Scheduler) finish(done []*Ticket) {
	for _, t := range done {
		if s.cfg.Recorder != nil && t.rec != nil {
			s.cfg.Recorder(t.rec)
		}
		close(t.done)
		if t.notify != nil {
			t.notify(t)
		}
	}
}

func (s *Scheduler) newRecordLocked(req Request, now time.Time) *decisions.Record {
	rec := new(decisions.Record)
	s.fillRecordLocked(rec, req, now)
	return rec
}

// fillRecordLocked fills in a new record's header: its ID and what it
// says of the request.
func (s *Scheduler) fillRecordLocked(rec *decisions.Record, req Request, now time.Time) {
	s.ids++
	var id [64]byte
	*rec = decisions.Record{
		ID:           string(strconv.AppendUint(append(append(id[:0], s.prefix...), '-'), s.ids, 10)),
		Time:         now,
		Model:        req.Model,
		Policy:       string(s.cfg.Policy),
		Attempt:      req.Attempt,
		PromptTokens: req.PromptTokens,
		PromptSource: req.PromptSource,
		MaxTokens:    req.MaxTokens,
		Class:        req.Class,
		Tenant:       req.Tenant,
	}
	s.stampSharedLocked(rec)
	out, src := s.est.estimate(&req)
	rec.ExpectedOutputTokens, rec.EstimateSource = int(math.Round(out)), src
}
