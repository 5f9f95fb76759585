package scheduler

import (
	"fmt"
	"slices"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// WorkerSpec describes a worker to the scheduler.
type WorkerSpec struct {
	// Name identifies the worker.
	Name string
	// Models the worker serves according to its config, used until its
	// Source reports discovered models.
	Models []string
	// MaxConcurrency caps Sluice's in-flight requests on the worker; 0
	// takes the reported slot count, else limit.Config.DefaultCap.
	MaxConcurrency int
	// Source publishes the worker's telemetry; nil means healthy with no
	// telemetry.
	Source snapshot.Source
	// Unserved names the client routes the worker's engine does not
	// serve (e.g. "/v1/messages" on TGI); see filter_route.go.
	Unserved []string
	// Kind is the worker's engine kind ("llamacpp", "vllm", ...), for
	// requests that only some kinds can serve (Request.Kinds).
	Kind string
	// LoadsAdapters says the worker loads LoRA adapters at run time, so
	// AdapterConfig.LoadOnDemand may choose it to load one.
	LoadsAdapters bool
}

// worker is the registry's entry for one worker: its spec and the
// counters admission keeps of it, under the scheduler's lock.
//
// A removed worker whose streams still run stays in Scheduler.leaving,
// counting them; added again under its name it takes that entry back, so
// those streams count against its limit. When the last ends, its life is
// over (retireLocked) and the predictor, the stats and Config.Retired are
// told.
type worker struct {
	spec     WorkerSpec
	order    int // its index in configuration order
	active   int // Sluice's requests in flight on it
	cost     float64
	draining bool
	removed  bool
	retired  bool // removed and no stream left: nothing learns from it any more
	lastPick uint64
	// last is the latest decision that scored it, lastIdx its index
	// among that decision's candidates.
	last    *decisions.Record
	lastIdx int
	statsAt stats.Handle // where its stats are, for statsSource.of
	// prefixKV is the KV cache size (tokens) last passed to the prefix
	// index's PrefixCapacity, so it is told only of changes.
	prefixKV int

	// remote is the other replicas' requests in flight on the worker as
	// the shared ledger last said (0 without one).
	remote int
	busy   busy // integral of active+remote over time
	// moved is the latest change of the learned limit.
	moved limit.Move
	// adapters are the LoRA adapters Sluice is loading on the worker or
	// loaded there (adapter.go).
	adapters lora.Holdings
	// kvSent are the prompt blocks of the requests in flight on it, with
	// KV-cache events (kvsent.go).
	kvSent []kvSent
}

func (w *worker) snapshot() *snapshot.Snapshot {
	if w.spec.Source == nil {
		return &emptySnapshot
	}
	if s := w.spec.Source.Snapshot(); s != nil {
		return s
	}
	return &emptySnapshot
}

var emptySnapshot snapshot.Snapshot

func (w *worker) models(s *snapshot.Snapshot) []string {
	if s.Models != nil {
		return s.Models
	}
	return w.spec.Models
}

func (w *worker) serves(s *snapshot.Snapshot, model string) bool {
	return slices.Contains(w.models(s), model)
}

// AddWorker adds a worker and places any queued requests it can take.
func (s *Scheduler) AddWorker(spec WorkerSpec) error {
	return s.update(func() ([]*Ticket, error) {
		if _, ok := s.byName[spec.Name]; ok {
			return nil, fmt.Errorf("scheduler: worker %q already exists", spec.Name)
		}
		w := s.leaving[spec.Name]
		if w != nil {
			delete(s.leaving, spec.Name)
			w.spec, w.removed, w.draining = spec, false, false
			w.prefixKV = 0 // the prefix index forgot the worker with its removal
		} else {
			w = &worker{spec: spec}
		}
		w.order = len(s.workers)
		s.workers = append(s.workers, w)
		s.byName[spec.Name] = w
		return s.dispatchLocked(), nil
	})
}

// RemoveWorker stops sending requests to a worker. Requests in flight on
// it finish normally; queued requests nobody left can serve are refused.
func (s *Scheduler) RemoveWorker(name string) error {
	return s.update(func() ([]*Ticket, error) {
		w, err := s.named(name)
		if err != nil {
			return nil, err
		}
		w.removed = true
		delete(s.byName, name)
		s.workers = slices.DeleteFunc(s.workers, func(x *worker) bool { return x == w })
		for i, x := range s.workers {
			x.order = i
		}
		s.leaving[name] = w
		s.retireLocked(w)
		return s.sweepLocked(nil), nil
	})
}

// named returns the worker of that name, under the lock.
func (s *Scheduler) named(name string) (*worker, error) {
	if w, ok := s.byName[name]; ok {
		return w, nil
	}
	return nil, fmt.Errorf("scheduler: no worker %q", name)
}

// forgetter is a StatsReader that holds per-worker state (*stats.Tracker).
type forgetter interface {
	Forget(worker string)
}

// retireLocked ends a removed worker's life once none of Sluice's streams
// runs on it: the predictor and the stats forget it (the stored averages
// stay, so a worker that comes back under the name is still known).
func (s *Scheduler) retireLocked(w *worker) {
	if !w.removed || w.active > 0 || w.retired {
		return
	}
	w.retired = true
	name := w.spec.Name
	delete(s.leaving, name)
	if p := s.cfg.Predictor; p != nil {
		p.Forget(name)
	}
	if f, ok := s.cfg.Stats.(forgetter); ok {
		f.Forget(name)
	}
	if s.cfg.Retired != nil {
		s.cfg.Retired(name)
	}
}

// SetDraining stops (or resumes) new requests to a worker; queued
// requests that no other worker can serve are refused.
func (s *Scheduler) SetDraining(name string, draining bool) error {
	return s.update(func() ([]*Ticket, error) {
		w, err := s.named(name)
		if err != nil {
			return nil, err
		}
		w.draining = draining
		return s.sweepLocked(s.dispatchLocked()), nil
	})
}

// UpdateWorker replaces a worker's spec in place. Its requests in flight
// and their cost stay, so a config reload cannot admit a fresh full batch
// while the old leases still run.
func (s *Scheduler) UpdateWorker(spec WorkerSpec) error {
	return s.update(func() ([]*Ticket, error) {
		w, err := s.named(spec.Name)
		if err != nil {
			return nil, err
		}
		w.spec = spec
		return s.sweepLocked(s.dispatchLocked()), nil
	})
}

// Kick places queued requests that have become placeable for reasons the
// scheduler cannot see (a worker turned healthy, loaded a model, reported
// more slots) and refuses those that no longer can be. The fleet calls it
// when a snapshot changes.
func (s *Scheduler) Kick() {
	s.update(func() ([]*Ticket, error) { return s.sweepLocked(s.dispatchLocked()), nil })
}

// admissibleLocked returns the error that makes waiting pointless for
// req: no worker serves the model, or none that does could ever take it.
// A loading worker counts as capacity on its way. speculative says no
// worker is known to serve the model but some worker's models are still
// unknown.
func (s *Scheduler) admissibleLocked(req Request) (err error, speculative bool) {
	serves, undiscovered, fits, routeless := false, false, false, false
	ap := s.adapterOf(req.Model)
	for _, w := range s.workers {
		snap := w.snapshot()
		if snap.Models == nil && len(w.spec.Models) == 0 && snap.Health != snapshot.HealthDown {
			undiscovered = true // its models are not known yet: it may serve this one
		}
		if !w.serves(snap, req.Model) && (ap == nil || !w.servesAdapterLocked(snap, ap)) {
			continue
		}
		if !w.servesRoute(req.Route) {
			routeless = true
			continue
		}
		serves = true
		if tooLong(snap, &req) {
			continue
		}
		fits = true
		if snap.Health != snapshot.HealthDown && !w.draining && !slices.Contains(req.Exclude, w.spec.Name) && kindAllowed(&req, w) {
			return nil, false
		}
	}
	switch {
	case undiscovered:
		return nil, !serves
	case !serves && routeless:
		return ErrRouteNotServed, false
	case !serves:
		return ErrUnknownModel, false
	case !fits:
		return ErrPromptTooLong, false
	}
	return ErrNoHealthyWorker, false
}

// tooLong reports whether req's prompt (an estimate, so the prompt alone)
// exceeds the worker's context per slot, when it reports one.
func tooLong(snap *snapshot.Snapshot, req *Request) bool {
	return snap.ContextTokens > 0 && req.PromptTokens > snap.ContextTokens
}

// served calls fn for every model some worker of ws serves.
func served(ws []*worker, fn func(model string)) {
	for _, w := range ws {
		for _, m := range w.models(w.snapshot()) {
			fn(m)
		}
	}
}

// StatsReader gives the measured averages of a worker: an immutable value,
// or nil when there are none. *stats.Tracker is one.
type StatsReader interface {
	Stats(worker string) *stats.WorkerStats
}

// noStats stands in for a worker without measured history.
var noStats stats.WorkerStats

// statsSource reads the workers' measured averages from a StatsReader,
// through a handle kept on each worker when it can (via).
type statsSource struct {
	r   StatsReader
	via statsVia
}

// of returns w's measured averages (&noStats when none). w's handle is
// under the scheduler's lock.
func (ss statsSource) of(w *worker) *stats.WorkerStats {
	var st *stats.WorkerStats
	switch {
	case ss.via != nil:
		st = ss.via.StatsVia(&w.statsAt, w.spec.Name)
	case ss.r != nil:
		st = ss.r.Stats(w.spec.Name)
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
