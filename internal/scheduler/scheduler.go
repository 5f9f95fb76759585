// Package scheduler decides which worker serves each request, and when.
//
// It scores every eligible worker (healthy, serving the model, under its
// concurrency limit) with a weighted sum of terms — active requests
// dominate, throughput is a reward, KV pressure and GPU load are visible —
// and the lowest score wins. When no worker has room the request waits in
// a bounded per-model queue, in priority and fair-share order (see
// queue), and is bound to whichever worker frees first (late binding).
// Picking and reserving are one step under one lock, so four requests
// arriving together at four idle workers land one per worker, with no
// randomness: ties go to the least recently picked worker, then to the
// worker listed first.
//
// The package is pure: no HTTP, no network call under its lock, time from
// a Clock. The HTTP router calls the blocking Admit; the virtual-time
// simulation calls Submit and Cancel and drives time itself.
//
// # Stages
//
// A pick (pick.go) runs as stages passing one value, made afresh for each
// request: resolve each worker's telemetry and stats once, compute its
// limit (limit.go), filter (filter*.go, kvfit.go), relax for a cached
// prefix (affinity.go), score (terms.go) or let a baseline choose
// (picker.go), and keep the record's slots (record.go), explained when
// the record is read.
//
// # Concurrency Model
//
// A Scheduler is safe for concurrent use. One mutex guards the state that
// admission changes: the registry's counters (in flight, outstanding
// cost, last pick, draining), the queues, the drain rates, the output
// estimator and the pickers' positions. A pick's first stage copies what
// the others read of that state into the pick value, beside immutable
// values: telemetry from each worker's Source, which returns an immutable
// snapshot without blocking, and measured averages from a StatsReader;
// neither is written here. The later stages (filters, beliefs, terms, the
// promise, the record's slots) are functions of the pick value and the
// configuration, testable without a Scheduler.
// Callbacks (Recorder, a ticket's notify) run after the lock is released,
// and a record's words are built when it is read.
// Every unlock is deferred, and nothing under the lock panics on purpose:
// a term, predictor or observer that panics fails the call it ran in
// (the lease it held, if any, stays its owner's to release), never the
// requests after it.
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
// (shares by token cost and tenant weight), then within the tenant the
// flow (Request.Flow) with the lowest tag, each weighing 1; within a flow
// arrival order.
//
// A ticket ends exactly once: bound to a Lease or refused with a *Refusal.
// Cancel refuses a ticket only if it is still queued and reports whether
// it did; if the ticket was bound first, its lease belongs to the caller,
// who must Release it. A queued ticket is also refused when the fleet
// changes (Kick, SetDraining, RemoveWorker) so that nobody left can serve
// it. A request answered in full ends with Lease.Complete (finish.go):
// its measurements reach the stats at the level it ran at, the tokens it
// produced teach the output estimate and the drain rate, and the slot is
// given back, under one acquisition of the lock; any other ends with
// Release. Releasing is the only way a reservation is given back, and it
// happens once however often it is asked for. A model's queue exists only
// while requests wait.
package scheduler

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/drain"
	"github.com/sluice-router/sluice/internal/fairq"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/outlen"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/sessions"
)

// Config configures a Scheduler.
type Config struct {
	// Weights of the score terms; used when Terms is nil.
	Weights Weights
	// Terms overrides the score terms (and their weights).
	Terms []WeightedTerm
	// MaxQueue bounds each model's queue; 0 refuses whenever no worker
	// has room.
	MaxQueue int
	// MaxQueueBytes bounds the bytes of request bodies (Request.BodyBytes)
	// that waiting requests hold, across models: a request that would
	// wait past it is refused (ErrQueueBytesFull); 0 sets no bound.
	MaxQueueBytes int64
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
	// KVFit turns on the KV-fit rule (kvfit.go): a worker whose shared KV
	// cache cannot take the request's prompt now is passed over, and the
	// request waits in the queue rather than inside a worker when none
	// can. The zero Config leaves it off; the router's configuration
	// (admission.kv_fit) turns it on by default.
	KVFit bool
	// Seed seeds the random baselines; Sluice's own policy uses no
	// randomness.
	Seed uint64
	// HashLoadBound is the consistent-hash baseline's load bound (1 or
	// more; 0 is DefaultHashLoadBound): how much busier than the mean a
	// worker may get before the requests that hash to it go on to the
	// next worker on the ring.
	HashLoadBound float64
	// Clock tells the time; WallClock when nil.
	Clock Clock
	// Stats supplies measured averages; nil means none. When it also
	// holds per-worker state to drop (a *stats.Tracker has Forget), it is
	// told when a removed worker's last stream has ended.
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
	// SessionAffinity turns on the session hint (sessions.go): a request
	// naming its session (Request.Session) is expected to find its
	// session's previous prompt on the worker that served it. It counts
	// through the prefix term, so only with a PrefixIndex and the term
	// weighted. SessionTTL (sessions.DefaultTTL when 0) is how long a
	// session is remembered after its latest request, MaxSessions
	// (sessions.DefaultMax when 0) how many are.
	SessionAffinity bool
	SessionTTL      time.Duration
	MaxSessions     int
	// IDPrefix starts every decision ID; when empty, the start time and a
	// random part, so IDs stay unique across restarts and between replicas
	// started together.
	IDPrefix string
	// Ledger, when set, shares reservations with other replicas (see
	// ledger.go); nil schedules this process's requests alone.
	Ledger Ledger
	// Limits configures adaptive per-worker concurrency (package limit).
	Limits limit.Config
	// Predictor, when set, predicts what a request would get on each
	// worker (package predict): the chosen worker's prediction goes in
	// the record and on the lease, and learns from each outcome
	// (Lease.Complete). With Admission "slo" it decides admission.
	Predictor *predict.Predictor
	// Retired, when set, is told the name of a removed worker once none
	// of Sluice's streams runs on it any more: its life is over, and what
	// its owner keeps of it may go. A worker added again under the name
	// before then goes on in the same life and is not retired. It is
	// called under the scheduler's lock and must not call the scheduler.
	Retired func(worker string)
	// Admission is how workers are judged: AdmitByLimits (the learned
	// limits, also when empty) or AdmitBySLO (the predicted promise; see
	// promise.go).
	Admission string
	// SLOs are the priority classes' SLOs by class name; a request's own
	// (Request.SLO) fills its fields first.
	SLOs map[string]predict.SLO
	// DefaultSLO is the SLO of a class without one; when zero it is
	// derived from what the model's workers do unloaded
	// (predict.DefaultSLO).
	DefaultSLO predict.SLO
	// Adapters configures LoRA adapters (adapter.go).
	Adapters AdapterConfig
	// KVIndex, when set, is the exact index of the blocks workers hold,
	// from their KV-cache events (*kvevents.Index): for a request with
	// KVBlocks it replaces the guess for every worker it can answer for.
	KVIndex KVIndex
}

// Scheduler admits requests to workers. See the package doc.
type Scheduler struct {
	cfg      Config
	limits   *limit.Config // immutable: records keep it to explain limits
	measured statsSource   // cfg.Stats
	terms    []WeightedTerm
	clock    Clock
	prefix   string
	closing  atomic.Bool

	classes  []Class // in priority order
	defClass int     // index of the default class
	order    fairq.Order

	mu      sync.Mutex
	workers []*worker // in configuration order
	byName  map[string]*worker
	// leaving are the removed workers whose streams still run, by name
	// (registry.go).
	leaving map[string]*worker
	queues  queues                 // only models with requests waiting
	rates   map[string]*drain.Rate // drain rates of served models
	est     outlen.Estimator
	seq     uint64        // tickets submitted
	picks   uint64        // reservations made
	ids     atomic.Uint64 // decision records made: read without the lock (fillRecord)
	picker  picker        // the policy's choice (picker.go)
	closed  bool
	changed changes
	// ledger makes cfg.Ledger's calls outside the lock (reserver.go); nil
	// without one. reserving holds, per model, the pick waiting for its
	// answer: no other request of the model is placed meanwhile.
	ledger    *ledgerRunner
	reserving map[string]*reservation
	// prefixWeighted says the prefix term counts: a PrefixIndex is set and
	// the term's weight is not 0. Otherwise no pick asks the index.
	prefixWeighted bool
	// sessions is the session table (internal/sessions); nil when off.
	sessions *sessions.Table
	// conf is what a pick's stages read of the configuration (pick.go).
	conf *pickConf
	// derivedSLO is each model's default SLO as last derived (promise.go).
	derivedSLO map[string]*derived
	// adapters are the configured LoRA adapters by name; nil when none.
	adapters map[string]AdapterSpec
	// steps are the borrow steps of the models requests wait for in
	// Admit (borrowstep.go).
	steps map[string]*borrowStep
}

// withDefaults fills in cfg's defaults and checks what New cannot work
// with.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Policy == "" {
		cfg.Policy = PolicySluice
	}
	if !slices.Contains(Policies, cfg.Policy) {
		return cfg, fmt.Errorf("scheduler: unknown policy %q", cfg.Policy)
	}
	if cfg.NoRecords && cfg.Recorder != nil {
		return cfg, fmt.Errorf("scheduler: NoRecords with a Recorder: the recorder would receive nothing")
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
	if cfg.HashLoadBound == 0 {
		cfg.HashLoadBound = DefaultHashLoadBound
	}
	if cfg.HashLoadBound < 1 || math.IsNaN(cfg.HashLoadBound) || math.IsInf(cfg.HashLoadBound, 0) {
		return cfg, fmt.Errorf("scheduler: hash load bound %v: must be 1 or more", cfg.HashLoadBound)
	}
	for _, a := range cfg.Adapters.Adapters {
		if a.Name == "" || a.Base == "" {
			return cfg, fmt.Errorf("scheduler: adapter %q: name and base are required", a.Name)
		}
	}
	return cfg, checkClasses(cfg.Classes)
}

// New returns a Scheduler with the given workers.
func New(cfg Config, workers ...WorkerSpec) (*Scheduler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	classes, def := sortClasses(cfg.Classes)
	s := &Scheduler{
		classes:    classes,
		defClass:   def,
		order:      fairq.Order{Overtake: cfg.MaxOvertake},
		rates:      map[string]*drain.Rate{},
		est:        outlen.Estimator{Default: cfg.DefaultOutputTokens},
		cfg:        cfg,
		limits:     new(cfg.Limits.WithDefaults()),
		terms:      cfg.Terms,
		clock:      cfg.Clock,
		prefix:     cfg.IDPrefix,
		byName:     map[string]*worker{},
		leaving:    map[string]*worker{},
		queues:     queues{},
		derivedSLO: map[string]*derived{},
	}
	if s.terms == nil {
		s.terms = DefaultTerms(cfg.Weights)
	}
	for _, a := range cfg.Adapters.Adapters {
		if s.adapters == nil {
			s.adapters = map[string]AdapterSpec{}
		}
		s.adapters[a.Name] = a
	}
	s.picker = newPicker(cfg.Policy, s.terms, cfg.Seed, cfg.HashLoadBound)
	if cfg.SessionAffinity {
		s.sessions = sessions.New(cfg.SessionTTL, cfg.MaxSessions)
	}
	s.measured.r = cfg.Stats
	s.measured.via, _ = cfg.Stats.(statsVia)
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
	if cfg.PrefixIndex != nil || cfg.KVIndex != nil {
		for _, wt := range s.terms {
			if _, ok := wt.Term.(readsPrefix); ok && wt.Weight != 0 {
				s.prefixWeighted = true
			}
		}
	}
	s.conf = &pickConf{cfg: &s.cfg, terms: s.terms, limits: s.limits, prefixWeighted: s.prefixWeighted,
		sessions: s.sessions != nil}
	s.conf.affinity = s.affinityOn()
	for _, w := range workers {
		if err := s.AddWorker(w); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Policy returns the policy in use.
func (s *Scheduler) Policy() Policy { return s.cfg.Policy }

// Close refuses every queued request with ErrClosed and every later one.
func (s *Scheduler) Close() {
	s.closing.Store(true)
	s.finish(s.refuseAll())
	if s.ledger != nil {
		s.ledger.wait() // the calls queued so far, the Unwaits above among them
	}
}

// refuseAll is Close under s.mu: it refuses every queued request, and
// every new one waiting for the ledger, returning them.
func (s *Scheduler) refuseAll() []*Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var done []*Ticket
	for _, q := range s.queues {
		done = slices.AppendSeq(done, q.All())
	}
	clear(s.queues)
	for _, t := range done {
		s.ledger.gone(t)
	}
	for _, res := range s.reserving {
		if !res.t.queued && !res.gone { // a new request waiting for the ledger
			done = append(done, res.t)
		}
	}
	for _, t := range done {
		s.refuseLocked(t, nil, ErrClosed)
	}
	s.changed.notify()
	return done
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
