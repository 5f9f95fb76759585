package vsim

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// Multi-turn chat at 95% of the demo fleet's capacity, with every worker
// capped at three streams, keeps a backlog in
// Sluice's queue, where affinity used to have no say: a waiting request
// was bound to whichever worker freed first, and a worker at its learned
// limit took nobody. With the prefix term the turns now find their cache
// (affinity.go in the scheduler): more of the prompt is cached and the
// median first token comes far sooner than with the term off, while no
// request is passed by one that arrived more than max_overtake after it.
func TestRun_PrefixAffinityHoldsUnderABacklog(t *testing.T) {
	fleet := sim.DemoFleet()
	base, err := bench.SynthesizeChat(bench.Chat{Arrivals: bench.Arrivals{Rate: 1}, Count: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	items, err := AtRate(base, 0.95*Capacity(fleet, base))
	if err != nil {
		t.Fatal(err)
	}
	run := func(prefixWeight float64) ([]bench.Result, bench.Summary) {
		cfg := DefaultConfig(fleet)
		// Low caps keep the backlog this test is about.
		cfg.MaxConcurrency = 3
		w := *cfg.Weights
		w.Prefix = prefixWeight
		cfg.Weights = &w
		res := mustRun(t, cfg, items)
		return res, bench.Summarize(res, bench.SLO{})
	}
	res, on := run(50)
	_, off := run(0)
	if on.Errors != 0 || off.Errors != 0 {
		t.Fatalf("errors: %d with the term, %d without", on.Errors, off.Errors)
	}
	t.Logf("prefix 50: cached %.1f%%, TTFT p50 %.0f ms p99 %.0f ms; prefix 0: cached %.1f%%, p50 %.0f ms p99 %.0f ms",
		100*on.PromptCached, on.TTFT.P50, on.TTFT.P99, 100*off.PromptCached, off.TTFT.P50, off.TTFT.P99)
	if on.PromptCached < off.PromptCached+0.04 {
		t.Errorf("prompt cached %.3f with the term, %.3f without: want at least 4 points more", on.PromptCached, off.PromptCached)
	}
	if on.TTFT.P50 > 0.5*off.TTFT.P50 {
		t.Errorf("TTFT p50 %.0f ms with the term, %.0f without: want at most half", on.TTFT.P50, off.TTFT.P50)
	}
	// Bounded overtaking: whoever was bound before a request that was
	// already waiting arrived at most max_overtake after it.
	maxOvertake := DefaultConfig(fleet).MaxOvertake
	passed := 0
	for i, a := range res {
		if a.QueueMs <= 0 {
			continue
		}
		bindA := a.Start + time.Duration(a.QueueMs*float64(time.Millisecond))
		for _, b := range res[i+1:] {
			if b.Start >= bindA {
				break
			}
			bindB := b.Start + time.Duration(b.QueueMs*float64(time.Millisecond))
			if b.Start > a.Start && bindB+time.Microsecond < bindA {
				passed++
				if gap := b.Start - a.Start; gap > maxOvertake {
					t.Fatalf("row %d, arrived %v after row %d, was bound before it", b.Row, gap, a.Row)
				}
			}
		}
	}
	if passed == 0 {
		t.Fatal("no request was bound out of arrival order: the test does not exercise the overtaking bound")
	}
}
