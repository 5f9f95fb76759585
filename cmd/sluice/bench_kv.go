package main

import (
	"bytes"
	"fmt"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// kvRow names the row of Sluice with the exact index of KV events.
const kvRow = "sluice + KV events"

// runVirtual is runPolicy's virtual branch that also returns the run's
// Stats, with the exact index of KV events when kv is set.
func runVirtual(o compareOpts, fleet []sim.WorkerSpec, p scheduler.Policy, kv bool, items []bench.Item) ([]bench.Result, vsim.Stats, error) {
	cfg := vsim.DefaultConfig(fleet)
	if o.router != nil {
		cfg = vsim.FromRouterConfig(*o.router, fleet)
	}
	cfg.Policy, cfg.Seed, cfg.MaxConcurrency, cfg.KVEvents = p, o.seed, o.maxConcurrency, kv
	return vsim.RunStats(cfg, items)
}

// writeExpectedCached sets, row by row, the prompt tokens the router
// expected the chosen workers to hold (vsim.Stats.ExpectedCached)
// against those the engines found cached: how right each index was.
func writeExpectedCached(md *bytes.Buffer, runs []bench.NamedRun, expected map[string]int64) {
	fmt.Fprintf(md, "Prompt tokens cached, as the router expected them at the chosen worker and as the engines found them (successful requests' prompts; the baselines expect nothing):\n\n| row | prompt tokens | expected cached | found cached | expected − found | TTFT p50 / p99 (ms) |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range runs {
		var prompt, found int64
		for _, x := range r.Results {
			if x.Status == 200 {
				prompt += int64(x.PromptTokens)
				found += int64(x.CachedTokens)
			}
		}
		s := r.Summary()
		exp := expected[r.Name]
		diff := "-"
		if found > 0 {
			diff = fmt.Sprintf("%+.2f%% of found", 100*float64(exp-found)/float64(found))
		}
		fmt.Fprintf(md, "| %s | %d | %d (%.1f%%) | %d (%.1f%%) | %s | %.0f / %.0f |\n", r.Name, prompt, exp, pct(exp, prompt), found, pct(found, prompt), diff, s.TTFT.P50, s.TTFT.P99)
	}
	fmt.Fprintln(md)
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
