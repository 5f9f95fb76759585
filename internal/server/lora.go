package server

import (
	"context"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/fleet"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// loraLoader is the scheduler's AdapterLoader: it loads an adapter on a
// worker through the fleet (vLLM's POST /v1/load_lora_adapter), outside
// the scheduler's lock, and counts the loads per worker and adapter.
type loraLoader struct {
	s        *Server
	loads    *prometheus.CounterVec
	failures *prometheus.CounterVec
}

func newLoRALoader(s *Server) *loraLoader {
	return &loraLoader{
		s: s,
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lora_loads_total",
			Help: "LoRA adapters Sluice loaded on a worker on demand (lora.load_on_demand), by worker and adapter.",
		}, []string{"worker", "adapter"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lora_load_failures_total",
			Help: "LoRA adapter loads that failed, by worker and adapter; the request went to another worker.",
		}, []string{"worker", "adapter"}),
	}
}

func (l *loraLoader) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.loads, l.failures}
}

// LoadAdapter implements scheduler.AdapterLoader.
func (l *loraLoader) LoadAdapter(ctx context.Context, worker string, a lora.Spec) error {
	fw := l.s.fleet.Get(worker)
	if fw == nil {
		return fmt.Errorf("worker %s is gone", worker)
	}
	already, err := fw.LoadAdapter(ctx, a)
	if err != nil {
		l.count(l.failures, worker, a.Name)
		l.s.log.Warn("LoRA adapter load failed", "worker", worker, "adapter", a.Name, "err", err)
		return err
	}
	if !already { // the worker held it already: nothing was loaded
		l.count(l.loads, worker, a.Name)
	}
	return nil
}

// count adds one to c's series of worker and adapter unless the worker
// was retired meanwhile (members): its series are deleted.
func (l *loraLoader) count(c *prometheus.CounterVec, worker, adapter string) {
	l.s.members.mu.RLock()
	defer l.s.members.mu.RUnlock()
	if l.s.members.liveLocked(worker) {
		c.WithLabelValues(worker, adapter).Inc()
	}
}

// forget drops a retired worker's series.
func (l *loraLoader) forget(worker string) {
	l.loads.DeletePartialMatch(prometheus.Labels{"worker": worker})
	l.failures.DeletePartialMatch(prometheus.Labels{"worker": worker})
}

// adapterConfig is the scheduler's LoRA configuration.
func (s *Server) adapterConfig(cfg config.Config) lora.Config {
	ac := cfg.LoRA.Scheduler()
	ac.Loader = s.lora
	return ac
}

// fleetConfig is w's fleet configuration, with the names of the LoRA
// files llama.cpp lists.
func (s *Server) fleetConfig(w config.Worker, key string) fleet.WorkerConfig {
	return fleet.WorkerConfig{Name: w.Name, URL: w.URL, Kind: w.Kind, Models: w.Models, GPUMetrics: w.GPUMetrics,
		GPUSelector: w.GPUSelector, AdapterPaths: s.cfg.LoRA.PathNames(), APIKey: key}
}

// workerSpec is w's scheduler entry: a vLLM worker loads adapters at run
// time (when vLLM allows it; a refusal sends the request elsewhere).
func workerSpec(w config.Worker, src snapshot.Source) scheduler.WorkerSpec {
	return scheduler.WorkerSpec{Name: w.Name, Models: w.Models, MaxConcurrency: int(w.MaxConcurrency), Source: src,
		Kind: w.Kind, Unserved: fleet.Unserved(w.Kind), LoadsAdapters: w.Kind == fleet.KindVLLM}
}

// modelEntry is one model of GET /v1/models; Parent is an adapter's base
// model, as vLLM lists it.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	OwnedBy string `json:"owned_by"`
	Created int64  `json:"created"`
	Parent  string `json:"parent,omitempty"`
}

// modelList is GET /v1/models: every model a worker serves, the adapters
// workers hold with their base, and the configured adapters that can be
// served (held somewhere, or loadable on demand).
func (s *Server) modelList() []modelEntry {
	ids := s.sched.Models()
	served := len(ids) // the models, before the adapters the workers hold
	parents := map[string]string{}
	for _, ws := range s.sched.Workers() {
		for _, a := range ws.Adapters {
			if a.Base != "" {
				parents[a.Name] = a.Base
			}
			if !slices.Contains(ids, a.Name) {
				ids = append(ids, a.Name)
			}
		}
	}
	for _, a := range s.cfg.LoRA.Adapters {
		parents[a.Name] = a.Base
		if s.cfg.LoRA.LoadOnDemand && slices.Contains(ids[:served], a.Base) && !slices.Contains(ids, a.Name) {
			ids = append(ids, a.Name)
		}
	}
	slices.Sort(ids)
	out := make([]modelEntry, 0, len(ids))
	for _, id := range ids {
		out = append(out, modelEntry{ID: id, Object: "model", OwnedBy: "sluice", Parent: parents[id]})
	}
	return out
}
