// Package scheduler decides which worker serves each request, and when.
//
// It scores every eligible worker (healthy, serving the model, under its
// concurrency limit) with a weighted sum of terms, and the lowest score
// wins; ties go to the least recently picked worker, then to the first
// listed, so a pick is never random. When no worker has room the request
// waits in a bounded per-model queue (package fairq gives its order) and
// is bound to whichever worker frees first. Picking and reserving are one
// step under one lock. docs/architecture.md lists the stages of a pick
// and the file of each; docs/routing.md describes the rules.
//
// The package is pure: no HTTP, no network call under its lock, time from
// a Clock. The HTTP router calls the blocking Admit; the virtual-time
// simulation calls Submit and Cancel and drives time itself.
//
// # Concurrency
//
// One mutex guards the state admission changes: the workers' counters,
// the queues, the drain rates, the output estimator and the pickers'
// positions. A pick's first stage copies what the later stages read of it
// into the pick value, so those stages are functions of the pick and the
// configuration. Telemetry (Source) and stats (StatsReader) are immutable
// values read without blocking. Callbacks (Recorder, a ticket's notify)
// run after the lock is released. Every unlock is deferred: a term or
// predictor that panics fails the call it ran in, never later requests.
//
// With a shared Ledger the ledger's calls are network round trips, made
// outside the lock, in order per model (reserver.go); a ticket may then
// still be pending when Submit returns.
//
// # Lifecycle
//
// A ticket ends exactly once: bound to a Lease or refused with a *Refusal.
// Cancel refuses a ticket only while it is still queued; if it was bound
// first, the lease is the caller's to Release. A request answered in full
// ends with Lease.Complete (finish.go), any other with Release; the slot
// is given back once however often either is called. A model's queue
// exists only while requests wait.
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
	"github.com/sluice-router/sluice/internal/lora"
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
	// MaxOvertake is the queue's aging bound: no request is bound before
	// one that has waited more than MaxOvertake longer, unless it is a
	// retry or of the same class and another tenant. DefaultMaxOvertake
	// when 0.
	MaxOvertake time.Duration
	// KVFit turns on the KV-fit rule (kvfit.go): a worker whose shared KV
	// cache cannot take the prompt now is passed over. Off in the zero
	// Config; admission.kv_fit turns it on by default.
	KVFit bool
	// Seed seeds the random baselines; Sluice's own policy uses no
	// randomness.
	Seed uint64
	// HashLoadBound is the consistent-hash baseline's load bound (1 or
	// more; 0 is DefaultHashLoadBound).
	HashLoadBound float64
	// Clock tells the time; WallClock when nil.
	Clock Clock
	// Stats supplies measured averages; nil means none. When it also
	// holds per-worker state to drop (a *stats.Tracker has Forget), it is
	// told when a removed worker's last stream has ended.
	Stats StatsReader
	// Recorder receives every decision record, outside the lock.
	Recorder func(*decisions.Record)
	// NoRecords skips building decision records (virtual-time runs over
	// large fleets): leases then have no Decision, refusals no DecisionID.
	// It cannot be combined with a Recorder.
	NoRecords bool
	// PrefixIndex, when set, tells how much of a request's prompt prefix
	// each worker is expected to hold (the prefix term) and learns where
	// each request went.
	PrefixIndex PrefixIndex
	// SessionAffinity turns on the session hint (sessions.go), which
	// counts through the prefix term. SessionTTL and MaxSessions bound the
	// table (sessions.DefaultTTL and sessions.DefaultMax when 0).
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
	// worker: the chosen worker's prediction goes in the record and on the
	// lease, and learns from each outcome. With AdmitBySLO it decides
	// admission.
	Predictor *predict.Predictor
	// Retired, when set, is told the name of a removed worker once none
	// of Sluice's streams runs on it any more. It is called under the
	// scheduler's lock and must not call the scheduler.
	Retired func(worker string)
	// Admission is AdmitByLimits (also when empty) or AdmitBySLO
	// (promise.go).
	Admission string
	// SLOs are the priority classes' SLOs by class name; a request's own
	// (Request.SLO) fills its fields first.
	SLOs map[string]predict.SLO
	// DefaultSLO is the SLO of a class without one; when zero it is
	// derived from what the model's workers do unloaded
	// (predict.DefaultSLO).
	DefaultSLO predict.SLO
	// Adapters configures LoRA adapters (adapter.go).
	Adapters lora.Config
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
	adapters map[string]lora.Spec
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
			s.adapters = map[string]lora.Spec{}
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
		// across replicas started in the same millisecond.
		var b [4]byte
		crand.Read(b[:])
		s.prefix = strconv.FormatInt(cfg.Clock.Now().UnixMilli(), 36) + hex.EncodeToString(b[:])
	}
	if cfg.Ledger != nil {
		s.ledger, s.reserving = newLedgerRunner(s, cfg.Ledger), map[string]*reservation{}
	}
	if cfg.PrefixIndex != nil || cfg.KVIndex != nil {
		for _, wt := range s.terms {
			if _, ok := wt.Term.(prefixMatch); ok && wt.Weight != 0 {
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
	s.update(func() ([]*Ticket, error) {
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
		return done, nil
	})
	if s.ledger != nil {
		s.ledger.wait() // the calls queued so far, the Unwaits above among them
	}
}

// update runs fn under the lock and, unless it failed, wakes whoever waits
// on Changed; then it ends the tickets fn ended, outside the lock. The
// unlock is deferred: a term or predictor that panics fails this call
// only, and leaves the lock free for the next.
func (s *Scheduler) update(fn func() ([]*Ticket, error)) error {
	done, err := func() ([]*Ticket, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		done, err := fn()
		if err == nil {
			s.changed.notify()
		}
		return done, err
	}()
	s.finish(done)
	return err
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
