// Package scheduler decides which worker serves each request, and when.
//
// It scores every eligible worker (healthy, serving the model, under its
// max_concurrency) with a weighted sum of terms — active requests dominate,
// throughput is a reward, KV pressure and GPU load are visible — and the
// lowest score wins. When no worker has room the request waits in a bounded
// per-model queue, oldest first, and is bound to whichever worker frees
// first (late binding). Picking and reserving are one step under one lock,
// so four requests arriving together at four idle workers land one per
// worker, with no randomness: ties go to the least recently picked worker,
// then to the worker listed first.
//
// The package is pure: no HTTP, no goroutines, time from a Clock. The HTTP
// router calls the blocking Admit; the virtual-time simulation calls Submit
// and Cancel and drives time itself.
//
// # Concurrency Model
//
// A Scheduler is safe for concurrent use. One mutex guards all admission
// state: per-worker in-flight counts and outstanding cost, the queues, and
// the pick sequence. Telemetry is read from each worker's Source, which
// returns an immutable snapshot without blocking, and measured averages
// from a StatsReader; neither is written here. Callbacks (Recorder, a
// ticket's notify) run after the lock is released.
//
// # Request Lifecycle and Ownership
//
// Submit creates a Ticket. A ticket ends exactly once: bound to a Lease or
// refused with a *Refusal. Cancel refuses a ticket only if it is still
// queued and reports whether it did; if the ticket was bound first, its
// lease belongs to the caller, who must Release it. Releasing the lease is
// the only way a reservation is given back, and Release is idempotent.
package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
	// before a worker has any measured history (and when max_tokens is
	// unset); 256 when zero.
	DefaultOutputTokens int
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
	// IDPrefix starts every decision ID; derived from the start time when
	// empty so IDs stay unique across restarts.
	IDPrefix string
	// Ledger, when set, shares reservations with other replicas (see
	// ledger.go); nil schedules this process's requests alone.
	Ledger Ledger
}

// WorkerSpec describes a worker to the scheduler.
type WorkerSpec struct {
	// Name identifies the worker.
	Name string
	// Models the worker serves according to its config, used until its
	// Source reports discovered models.
	Models []string
	// MaxConcurrency caps Sluice's in-flight requests on the worker; 0
	// takes the worker's reported slot count, else 1.
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
	cfg     Config
	terms   []WeightedTerm
	clock   Clock
	prefix  string
	closing atomic.Bool

	mu      sync.Mutex
	workers []*worker // in configuration order
	byName  map[string]*worker
	queues  map[string]*queue
	seq     uint64 // tickets submitted
	picks   uint64 // reservations made
	ids     uint64 // decision records made
	rr      uint64 // round-robin position
	rng     *rand.Rand
	scratch scratch
	idxBuf  []int
	snapBuf []*Snapshot
	candBuf []Candidate
	whyBuf  []uint8
	eligBuf []*worker
	closed  bool
	changed chan struct{} // closed at the next state change; nil when nobody waits
	shared  ledgerState
}

type worker struct {
	spec     WorkerSpec
	order    int
	active   int
	cost     float64
	draining bool
	removed  bool
	lastPick uint64
	last     *decisions.Record // the latest decision that scored it
	lastIdx  int               // its index among last's candidates
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

func (w *worker) limit(s *Snapshot) int {
	switch {
	case w.spec.MaxConcurrency > 0:
		return w.spec.MaxConcurrency
	case s.Slots > 0:
		return s.Slots
	}
	return 1
}

func (w *worker) models(s *Snapshot) []string {
	if s.Models != nil {
		return s.Models
	}
	return w.spec.Models
}

func (w *worker) serves(s *Snapshot, model string) bool {
	return slices.Contains(w.models(s), model)
}

// queue is one model's FIFO of waiting tickets, plus its drain rate.
type queue struct {
	tickets     []*Ticket
	lastRelease time.Time
	interval    stats.EMA // seconds between releases of this model's requests
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
	s := &Scheduler{
		cfg:    cfg,
		terms:  cfg.Terms,
		clock:  cfg.Clock,
		prefix: cfg.IDPrefix,
		byName: map[string]*worker{},
		queues: map[string]*queue{},
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed)),
	}
	if s.terms == nil {
		s.terms = DefaultTerms(cfg.Weights)
	}
	if s.prefix == "" {
		s.prefix = strconv.FormatInt(cfg.Clock.Now().UnixMilli(), 36)
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
// in flight on it keep their leases and finish normally.
func (s *Scheduler) RemoveWorker(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.byName[name]
	if !ok {
		return fmt.Errorf("scheduler: no worker %q", name)
	}
	w.removed = true
	delete(s.byName, name)
	s.workers = slices.DeleteFunc(s.workers, func(x *worker) bool { return x == w })
	for i, x := range s.workers {
		x.order = i
	}
	s.notifyLocked()
	return nil
}

// SetDraining stops (or resumes) new requests to a worker; requests in
// flight finish normally.
func (s *Scheduler) SetDraining(name string, draining bool) error {
	s.mu.Lock()
	w, ok := s.byName[name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("scheduler: no worker %q", name)
	}
	w.draining = draining
	done := s.dispatchLocked()
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
	return nil
}

// Kick places queued requests that have become placeable for reasons the
// scheduler cannot see itself: a worker turned healthy, loaded a model, or
// reported more slots. The fleet calls it when a snapshot changes.
func (s *Scheduler) Kick() {
	s.mu.Lock()
	done := s.dispatchLocked()
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
		for _, t := range q.tickets {
			s.sharedGoneLocked(t)
			s.refuseLocked(t, ErrClosed, "shutting down")
			done = append(done, t)
		}
		q.tickets = nil
	}
	s.notifyLocked()
	s.mu.Unlock()
	s.finish(done)
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
	released atomic.Bool

	// Worker is the chosen worker's name.
	Worker string
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
	l.w.active--
	l.w.cost -= l.cost
	if l.w.active == 0 {
		l.w.cost = 0 // no float drift on an idle worker
	}
	q := s.queueLocked(l.model)
	if !q.lastRelease.IsZero() {
		q.interval = q.interval.Add(now.Sub(q.lastRelease).Seconds(), 0.2)
	}
	q.lastRelease = now
	done := s.dispatchLocked()
	s.notifyLocked()
	s.mu.Unlock()
	s.sharedRelease(l)
	s.finish(done)
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
	t := &Ticket{req: req, enq: now, notify: notify, done: make(chan struct{}), front: req.Attempt > 1}
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
	q := s.queueLocked(t.req.Model)
	t.depth = len(q.tickets)
	// Oldest first: a new request may only jump the queue when nobody of
	// its model is waiting (a retry was accepted earlier and goes first).
	if len(q.tickets) == 0 || t.front || s.cfg.Policy != PolicySluice {
		if w, rec := s.pickLocked(t.req, now, false); w != nil {
			s.bindLocked(t, w, rec, now)
			return []*Ticket{t}
		} else if s.cfg.Policy != PolicySluice {
			_, rec = s.pickLocked(t.req, now, true)
			s.refuseWithLocked(t, rec, s.unplaceable(t.req))
			return []*Ticket{t}
		}
	}
	switch why := s.whyNotWaitLocked(t.req); {
	case why != nil:
		_, rec := s.pickLocked(t.req, now, true)
		s.refuseWithLocked(t, rec, why)
		return []*Ticket{t}
	case len(q.tickets) >= s.cfg.MaxQueue && !t.front:
		_, rec := s.pickLocked(t.req, now, true)
		s.refuseWithLocked(t, rec, ErrQueueFull)
		return []*Ticket{t}
	}
	t.queued = true
	if t.front {
		q.tickets = slices.Insert(q.tickets, 0, t)
	} else {
		q.tickets = append(q.tickets, t)
	}
	s.sharedQueuedLocked(t)
	// Placing waits behind the queue, but the queue may be held only by
	// retries that excluded the free workers.
	return s.dispatchLocked()
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
	serves, undiscovered := false, false
	for _, w := range s.workers {
		snap := w.snapshot()
		if snap.Models == nil && len(w.spec.Models) == 0 && snap.Health != HealthDown {
			undiscovered = true // its models are not known yet: it may serve this one
		}
		if !w.serves(snap, req.Model) {
			continue
		}
		serves = true
		if snap.Health != HealthDown && !w.draining && !slices.Contains(req.Exclude, w.spec.Name) {
			return nil
		}
	}
	switch {
	case undiscovered:
		return nil
	case !serves:
		return ErrUnknownModel
	}
	return ErrNoHealthyWorker
}

// Cancel refuses t with cause (ErrQueueTimeout or ErrClientGone) if it is
// still queued, and reports whether it did. When it returns false the
// ticket has ended already; if it was bound, the caller owns the lease.
func (s *Scheduler) Cancel(t *Ticket, cause error) bool {
	now := s.clock.Now()
	s.mu.Lock()
	if !t.queued {
		s.mu.Unlock()
		return false
	}
	q := s.queueLocked(t.req.Model)
	q.tickets = slices.DeleteFunc(q.tickets, func(x *Ticket) bool { return x == t })
	s.sharedGoneLocked(t)
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

// QueueDepth returns how many requests wait for model.
func (s *Scheduler) QueueDepth(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.queues[model]; ok {
		return len(q.tickets)
	}
	return 0
}

// QueueDepths returns the depth of every model's queue.
func (s *Scheduler) QueueDepths() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.queues))
	for m, q := range s.queues {
		out[m] = len(q.tickets)
	}
	return out
}

func (s *Scheduler) queueLocked(model string) *queue {
	q, ok := s.queues[model]
	if !ok {
		q = &queue{}
		s.queues[model] = q
	}
	return q
}

// dispatchLocked binds queued requests to workers with room, oldest first
// across models, until no queue has a placeable request.
func (s *Scheduler) dispatchLocked() []*Ticket {
	if s.cfg.Policy != PolicySluice {
		return nil
	}
	var done []*Ticket
	now := s.clock.Now()
	heads := make([]*queue, 0, len(s.queues))
	for {
		heads = heads[:0]
		for _, q := range s.queues {
			if len(q.tickets) > 0 {
				heads = append(heads, q)
			}
		}
		slices.SortFunc(heads, func(a, b *queue) int { return ticketOrder(a.tickets[0], b.tickets[0]) })
		bound := false
		for _, q := range heads {
			if t, w, rec := s.placeableLocked(q, now); t != nil {
				q.tickets = slices.DeleteFunc(q.tickets, func(x *Ticket) bool { return x == t })
				s.bindLocked(t, w, rec, now)
				done = append(done, t)
				bound = true
				break
			}
		}
		if !bound {
			return s.sweepUnservedLocked(done)
		}
	}
}

// sweepUnservedLocked refuses the requests waiting for a model that, now
// that every worker's models are known, nobody serves. They were queued
// while some worker's models were still being discovered.
func (s *Scheduler) sweepUnservedLocked(done []*Ticket) []*Ticket {
	for model, q := range s.queues {
		if len(q.tickets) == 0 || !errors.Is(s.whyNotWaitLocked(Request{Model: model}), ErrUnknownModel) {
			continue
		}
		for _, t := range q.tickets {
			_, rec := s.pickLocked(t.req, s.clock.Now(), true)
			s.refuseWithLocked(t, rec, ErrUnknownModel)
			done = append(done, t)
		}
		q.tickets = nil
	}
	return done
}

// placeableLocked returns the oldest ticket of q that a worker can take
// now. Tickets normally share one fate (same model, same eligible
// workers), so the scan stops at the first unplaceable ticket; only a
// retry that excludes workers which failed it is skipped over, so it
// cannot hold back the requests behind it.
func (s *Scheduler) placeableLocked(q *queue, now time.Time) (*Ticket, *worker, *decisions.Record) {
	for _, t := range q.tickets {
		if w, rec := s.pickQueuedLocked(t, now); w != nil {
			return t, w, rec
		}
		if len(t.req.Exclude) == 0 {
			break
		}
	}
	return nil, nil, nil
}

// ticketOrder orders tickets for placement: retries first, then by arrival.
func ticketOrder(a, b *Ticket) int {
	if a.front != b.front {
		if a.front {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.seq, b.seq)
}

// expectedCost estimates the tokens a request will keep a worker busy
// with: its prompt plus its expected output, which is the worker's measured
// mean output capped by max_tokens (output length is unknowable up front).
func (s *Scheduler) expectedCost(w *worker, req Request) float64 {
	out := float64(s.cfg.DefaultOutputTokens)
	if s.cfg.Stats != nil {
		if st := s.cfg.Stats.Stats(w.spec.Name); st != nil && st.OutputTokens.Known() {
			out = st.OutputTokens.Value
		}
	}
	if req.MaxTokens > 0 {
		out = math.Min(out, float64(req.MaxTokens))
	}
	return float64(req.PromptTokens) + out
}

func (s *Scheduler) bindLocked(t *Ticket, w *worker, rec *decisions.Record, now time.Time) {
	cost := s.expectedCost(w, t.req)
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
	t.lease = &Lease{s: s, w: w, cost: cost, model: t.req.Model, Worker: w.spec.Name, Decision: rec, QueueWait: wait}
	s.sharedBindLocked(t, t.lease)
	t.rec = rec
	t.queued = false
}

func (s *Scheduler) refuseWithLocked(t *Ticket, rec *decisions.Record, cause error) {
	wait := s.clock.Now().Sub(t.enq)
	ref := &Refusal{Err: cause, Reason: reasonOf(cause), RetryAfter: s.retryAfterLocked(t.req.Model), QueueWait: wait}
	if rec != nil {
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

// retryAfterLocked estimates when a request for model would be served:
// the queue depth times the mean interval between completions observed for
// the model, at least a second. Without history it is the queue timeout.
func (s *Scheduler) retryAfterLocked(model string) time.Duration {
	q := s.queueLocked(model)
	d := s.cfg.QueueTimeout
	if q.interval.Known() {
		d = time.Duration(float64(len(q.tickets)+1) * q.interval.Value * float64(time.Second))
	}
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
	s.ids++
	rec := &decisions.Record{
		ID:           s.prefix + "-" + strconv.FormatUint(s.ids, 10),
		Time:         now,
		Model:        req.Model,
		Policy:       string(s.cfg.Policy),
		Attempt:      req.Attempt,
		PromptTokens: req.PromptTokens,
		PromptSource: req.PromptSource,
		MaxTokens:    req.MaxTokens,
	}
	s.stampSharedLocked(rec)
	return rec
}
