package vsim

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRunHTTP_AgreesWithVirtualTime runs one small scenario twice — in
// virtual time and through the real router over loopback HTTP with the sim
// fleet at a time scale of 2 — and checks that the aggregates agree. The
// runs cannot agree request by request: wall-clock jitter moves arrivals
// by a millisecond or so, which changes batch membership and so the
// engines' interference draws, and every HTTP hop adds a few wall
// milliseconds (more under the race detector) that the time scale
// multiplies into model time. So the scenario has long prompts (TTFT
// around 400 ms) and a modest scale. The tolerances are 25% for mean TTFT
// and 15% for mean end-to-end latency; the medians of 30 requests jump
// between neighbouring samples, so they get 30%.
// Every request must succeed in both.
func TestRunHTTP_AgreesWithVirtualTime(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time run")
	}
	fleet := sim.DemoFleet()
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: 30, Seed: 11,
		Prompt: bench.Lengths{Median: 2000, Sigma: 0.4, Min: 500, Max: 6000}, Output: bench.Lengths{Median: 120, Sigma: 0.6, Min: 10, Max: 400}})
	if err != nil {
		t.Fatal(err)
	}
	items, err = AtRate(items, 0.5*Capacity(fleet, items))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(fleet)
	// Fixed limits: the adaptive controller makes discrete choices from
	// its first few samples, so in a run of 30 requests a timing
	// difference of a millisecond can change a limit and with it the
	// queueing; the two modes are compared with it on in
	// docs/benchmarks.md over hundreds of requests.
	cfg.Concurrency.Fixed = true
	virt := mustRun(t, cfg, items)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	real, _, err := RunHTTPStats(ctx, HTTPConfig{Router: cfg, TimeScale: 2}, items)
	if err != nil {
		t.Fatal(err)
	}
	v, r := bench.Summarize(virt, bench.SLO{}), bench.Summarize(real, bench.SLO{})
	if v.Count != r.Count || v.OK != len(items) || r.OK != len(items) {
		t.Fatalf("virtual %d/%d ok, real %d/%d ok (errors %v)", v.OK, v.Count, r.OK, r.Count, r.ErrorsByKind)
	}
	for _, c := range []struct {
		name       string
		virt, real float64
		tol        float64
	}{
		{"mean TTFT", v.TTFT.Mean, r.TTFT.Mean, 0.25},
		{"p50 TTFT", v.TTFT.P50, r.TTFT.P50, 0.30},
		{"mean E2E", v.E2E.Mean, r.E2E.Mean, 0.15},
		{"p50 E2E", v.E2E.P50, r.E2E.P50, 0.30},
	} {
		t.Logf("%-9s virtual %8.1fms real %8.1fms", c.name, c.virt, c.real)
		if d := math.Abs(c.real-c.virt) / c.virt; d > c.tol {
			t.Errorf("%s: virtual %.1fms, real %.1fms: %.0f%% apart, more than %.0f%%", c.name, c.virt, c.real, 100*d, 100*c.tol)
		}
	}
}
