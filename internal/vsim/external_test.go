package vsim

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRunHTTPStats_ExternalWorkers runs against workers the run did not
// start — here two sim workers the test starts itself, fast (time scale
// 20) so that wall time and model time differ — configured as a router
// config would name real engines: kind llamacpp, no models (discovered),
// no GPU exporter. Every request must be answered through them, ask for
// the model they list, and be measured on the wall clock: no result may
// take longer than the whole run did, as one multiplied by the workers'
// time scale would.
func TestRunHTTPStats_ExternalWorkers(t *testing.T) {
	p := sim.DefaultParams()
	p.Model = "external-model"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fl, err := sim.StartFleet(ctx, []sim.WorkerSpec{{Name: "a", Params: p, TimeScale: 20}, {Name: "b", Params: p, TimeScale: 20}}, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	var ext []config.Worker
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		ext = append(ext, config.Worker{Name: "ext-" + w.Name, URL: w.URL, Kind: "llamacpp"})
	}
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 20}, Count: 16, Seed: 2,
		Prompt: bench.Lengths{Median: 200, Sigma: 0.3, Min: 50, Max: 400}, Output: bench.Lengths{Median: 20, Sigma: 0.3, Min: 5, Max: 40}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(nil)
	cfg.MaxConcurrency = 2
	began := time.Now()
	// TimeScale is ignored with External: the run is on the wall clock.
	res, st, err := RunHTTPStats(ctx, HTTPConfig{Router: cfg, External: ext, TimeScale: 50}, items)
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(began)
	if s := bench.Summarize(res, bench.SLO{}); len(res) != len(items) || s.OK != len(items) {
		t.Fatalf("%d results, %d ok of %d requests (errors %v)", len(res), s.OK, len(items), s.ErrorsByKind)
	}
	for _, r := range res {
		if r.E2E <= 0 || r.E2E > wall {
			t.Fatalf("request %d took %v against a run of %v: not wall-clock time", r.Index, r.E2E, wall)
		}
	}
	total := 0
	for _, w := range ext {
		peak, ok := st.PeakInFlight[w.Name]
		if !ok {
			t.Fatalf("no in-flight count for %s: %v", w.Name, st.PeakInFlight)
		}
		if peak > 2 {
			t.Errorf("%s had %d requests open at once, over max_concurrency 2", w.Name, peak)
		}
		total += peak
	}
	if total == 0 {
		t.Fatalf("no request reached the external workers: %v", st.PeakInFlight)
	}
	for _, w := range fl.Workers() {
		if m := w.Server.Metrics(); m.PredictedTokensTotal == 0 {
			t.Errorf("worker %s generated nothing: the load did not spread over the external workers", w.Name)
		}
	}
}
