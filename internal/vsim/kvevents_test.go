package vsim

import (
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/sim"
)

// With KV events in virtual time the router's exact index holds what the
// engines' caches hold: over a multi-turn chat load at 80% of the demo
// fleet, the prompt tokens it expected the chosen worker to hold come
// within 2% of those the engines found cached, and every decision's
// prefix term names the events; the guess, without them, is further off.
func TestRun_KVEventsIndexIsExact(t *testing.T) {
	fleet := sim.DemoFleet()
	base, err := bench.SynthesizeChat(bench.Chat{Arrivals: bench.Arrivals{Rate: 1}, Count: 800, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	items, err := AtRate(base, 0.8*Capacity(fleet, base))
	if err != nil {
		t.Fatal(err)
	}
	run := func(kv bool) (bench.Summary, Stats, int64, int) {
		cfg := DefaultConfig(fleet)
		cfg.KVEvents = kv
		named := 0
		cfg.Recorder = func(r *decisions.Record) {
			r.Explain()
			for _, c := range r.Candidates {
				for _, tm := range c.Terms {
					if tm.Name == "prefix" && strings.HasPrefix(tm.Source, "vLLM KV events, seq ") {
						named++
						return
					}
				}
			}
		}
		res, st, err := RunStats(cfg, items)
		if err != nil {
			t.Fatal(err)
		}
		var found int64
		for _, r := range res {
			found += int64(r.CachedTokens)
		}
		return bench.Summarize(res, bench.SLO{}), st, found, named
	}
	on, stOn, foundOn, namedOn := run(true)
	_, stOff, foundOff, namedOff := run(false)
	share := func(expected, found int64) float64 { return float64(expected-found) / float64(max(found, 1)) }
	t.Logf("KV events: expected %d, found %d (%+.2f%%), cached %.1f%%, TTFT p50 %.0f p99 %.0f; guess: expected %d, found %d (%+.2f%%)",
		stOn.ExpectedCached, foundOn, 100*share(stOn.ExpectedCached, foundOn), 100*on.PromptCached, on.TTFT.P50, on.TTFT.P99,
		stOff.ExpectedCached, foundOff, 100*share(stOff.ExpectedCached, foundOff))
	if on.Errors != 0 || foundOn == 0 {
		t.Fatalf("%d errors, %d tokens found cached", on.Errors, foundOn)
	}
	if d := share(stOn.ExpectedCached, foundOn); d > 0.02 || d < -0.02 {
		t.Errorf("with KV events the router expected %d cached tokens, the engines found %d: %.1f%% off, want within 2%%", stOn.ExpectedCached, foundOn, 100*d)
	}
	if namedOn < len(items)*9/10 || namedOff != 0 {
		t.Errorf("decisions naming the KV events: %d of %d with them, %d without", namedOn, len(items), namedOff)
	}
	if dOn, dOff := share(stOn.ExpectedCached, foundOn), share(stOff.ExpectedCached, foundOff); abs(dOff) <= abs(dOn) {
		t.Errorf("the guess is off by %.1f%%, the exact index by %.1f%%: the index is no better", 100*dOff, 100*dOn)
	}
}

func abs(x float64) float64 { return max(x, -x) }
