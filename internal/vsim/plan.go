package vsim

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// PlanConfig asks how many workers a load needs.
type PlanConfig struct {
	// Router is the simulated router; its Workers are replaced.
	Router Config
	// Card is the engine of every worker; Speeds, cycled, set their
	// Speed (a mix such as 1,1,0.6). Empty Speeds means all at Card.Speed.
	Card   sim.Params
	Speeds []float64
	// Items is the load.
	Items []bench.Item
	// TargetP99TTFT is the goal: the p99 time to first token, with every
	// request served (no refusal or error).
	TargetP99TTFT time.Duration
	// MaxWorkers bounds the search; 0 means 1000.
	MaxWorkers int
}

// PlanStep is one fleet size tried.
type PlanStep struct {
	// Workers is the fleet size; Summary what it achieved; Met whether
	// the goal held.
	Workers int
	Summary bench.Summary
	Met     bool
}

// PlanResult is the answer of Plan.
type PlanResult struct {
	// Workers is the smallest fleet size found that meets the goal (0 if
	// none up to MaxWorkers did).
	Workers int
	// Steps lists every size tried, in the order tried.
	Steps []PlanStep
}

// PlanFleet returns n workers named gpu-0.. with card's parameters, the
// Speeds cycled over them and seeds 1..n.
func PlanFleet(card sim.Params, speeds []float64, n int) []sim.WorkerSpec {
	out := make([]sim.WorkerSpec, n)
	for i := range out {
		p := card
		if len(speeds) > 0 {
			p.Speed = speeds[i%len(speeds)]
		}
		p.Seed = int64(i + 1)
		out[i] = sim.WorkerSpec{Name: fmt.Sprintf("gpu-%d", i), Params: p}
	}
	return out
}

// Plan finds the smallest number of workers that meets the goal: it
// doubles the fleet until the goal holds, then bisects between the last
// failing and the first passing size. It assumes more workers never hurt,
// which holds for Sluice's policy up to scheduling noise.
func Plan(pc PlanConfig) (PlanResult, error) {
	if len(pc.Items) == 0 {
		return PlanResult{}, errors.New("vsim: plan: the load is empty")
	}
	if pc.TargetP99TTFT <= 0 {
		return PlanResult{}, errors.New("vsim: plan: a positive p99 TTFT target is needed")
	}
	if err := pc.Card.Validate(); err != nil {
		return PlanResult{}, fmt.Errorf("vsim: plan: card: %w", err)
	}
	maxW := pc.MaxWorkers
	if maxW <= 0 {
		maxW = 1000
	}
	var res PlanResult
	try := func(n int) (bool, error) {
		cfg := pc.Router
		cfg.Workers = PlanFleet(pc.Card, pc.Speeds, n)
		results, err := Run(cfg, pc.Items)
		if err != nil {
			return false, fmt.Errorf("vsim: plan with %d workers: %w", n, err)
		}
		s := bench.Summarize(results, bench.SLO{})
		met := s.Errors == 0 && s.TTFT.P99 <= float64(pc.TargetP99TTFT)/float64(time.Millisecond)
		res.Steps = append(res.Steps, PlanStep{Workers: n, Summary: s, Met: met})
		return met, nil
	}
	lo, hi := 0, 0 // lo fails (0 trivially), hi passes
	for n := 1; ; n = min(n*2, maxW) {
		ok, err := try(n)
		if err != nil {
			return res, err
		}
		if ok {
			hi = n
			break
		}
		lo = n
		if n == maxW {
			return res, nil
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := try(mid)
		if err != nil {
			return res, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	res.Workers = hi
	return res, nil
}
