package vsim

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// BenchmarkRun_1000Workers simulates an hour of Poisson traffic at 5.5
// req/s (the Azure conversation trace's mean rate) over 1,000 reference
// workers under Sluice's policy. b.N counts whole simulated hours.
func BenchmarkRun_1000Workers(b *testing.B) {
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 5.5}, Duration: time.Hour, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig(PlanFleet(sim.DefaultParams(), nil, 1000))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(cfg, items); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(items)), "requests/op")
}

// BenchmarkRun_DemoFleetSaturated simulates 2,000 requests at 95% of the
// demo fleet's estimated capacity, where the queue is rarely empty and the
// loop steps engines one event at a time.
func BenchmarkRun_DemoFleetSaturated(b *testing.B) {
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: 2000, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	fleet := sim.DemoFleet()
	if items, err = AtRate(items, 0.95*Capacity(fleet, items)); err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig(fleet)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(cfg, items); err != nil {
			b.Fatal(err)
		}
	}
}
