package scheduler

import (
	"time"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// Briefs and Gauges are the cheap views of the workers that probes,
// metrics and samplers read often, without Workers' explanations.

// WorkerBrief is who a worker is, what it serves and whether it takes
// requests.
type WorkerBrief struct {
	Name     string
	Models   []string // shared with the scheduler: do not modify
	Health   snapshot.Health
	Draining bool
}

// Eligible reports whether the worker may be given new requests: healthy,
// or not yet probed, and not draining.
func (b *WorkerBrief) Eligible() bool {
	return !b.Draining && (b.Health == snapshot.HealthOK || b.Health == snapshot.HealthUnknown)
}

// Briefs returns every worker's brief in configuration order. It reads
// what is there and computes nothing.
func (s *Scheduler) Briefs() []WorkerBrief {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]WorkerBrief, 0, len(s.workers))
	for _, w := range s.workers {
		out = append(out, w.briefLocked(w.snapshot()))
	}
	return out
}

func (w *worker) briefLocked(snap *snapshot.Snapshot) WorkerBrief {
	return WorkerBrief{Name: w.spec.Name, Models: w.models(snap), Health: snap.Health, Draining: w.draining}
}

// WorkerGauges are a worker's numbers as metrics and charts show them:
// WorkerState's fields of the same names.
type WorkerGauges struct {
	WorkerBrief
	Active        int
	OtherReplicas int
	Limit         int
	Learned       int
	Cap           int
	Floor         float64
	Snapshot      *snapshot.Snapshot
}

// Gauges returns every worker's gauges in configuration order, each limit
// computed as Workers computes it.
func (s *Scheduler) Gauges() []WorkerGauges {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out, _ := s.gaugesLocked(now)
	return out
}

// gaugesLocked returns every worker's gauges and its limit, as Gauges
// says.
func (s *Scheduler) gaugesLocked(now time.Time) ([]WorkerGauges, []limit.State) {
	type byModel struct {
		floor  float64
		waited time.Duration
	}
	models := map[string]byModel{}
	out := make([]WorkerGauges, 0, len(s.workers))
	lims := make([]limit.State, 0, len(s.workers))
	for _, w := range s.workers {
		snap := w.snapshot()
		var m byModel
		if ms := w.models(snap); len(ms) > 0 && !s.limits.Fixed {
			var ok bool
			if m, ok = models[ms[0]]; !ok {
				m = byModel{s.floorFor(ms[0]), s.queues.of(ms[0]).OldestWait(now)}
				models[ms[0]] = m
			}
		}
		lim := w.limitOf(s.limits, snap, s.measured.of(w), m.floor, m.waited, &Env{Now: now, StaleAfter: s.cfg.StaleAfter})
		out = append(out, WorkerGauges{WorkerBrief: w.briefLocked(snap), Active: w.active, OtherReplicas: w.remote,
			Limit: lim.Limit, Learned: lim.Learned, Cap: lim.Cap, Floor: lim.Floor, Snapshot: snap})
		lims = append(lims, lim)
	}
	return out, lims
}
