package vsim

import (
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRun_AgentSessions runs the coding-agent load (bench.Agent: sessions
// whose prompts grow by one turn, 90%+ of each prompt repeated, tool
// pauses of seconds and user pauses of minutes) on the demo fleet at 50%
// and 80% of capacity, with least-connections, Sluice without the
// session hint and Sluice with it. Sluice must find more cached prompt
// tokens than least-connections, the hint within 2% of as many as without
// it, its p99 first token no worse than without it (5% noise), and the
// hint must not add scrapes where a worker runs two or more requests, over
// 1.5× the fleet's mean load, while another idles.
//
//	go test -run TestRun_AgentSessions -v ./internal/vsim/
func TestRun_AgentSessions(t *testing.T) {
	fleet, base := agentLoad(t)
	base = openLoop(base)
	for _, load := range []float64{0.5, 0.8} {
		items, err := AtRate(base, load*Capacity(fleet, base))
		if err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			cached int
			sum    bench.Summary
			bal    Balance
		}
		run := func(policy scheduler.Policy, sessions bool) outcome {
			cfg := DefaultConfig(fleet)
			cfg.Policy, cfg.SessionAffinity = policy, sessions
			res, st, err := RunStats(cfg, items)
			if err != nil {
				t.Fatal(err)
			}
			o := outcome{sum: bench.Summarize(res, bench.SLO{}), bal: st.Balance}
			for _, r := range res {
				o.cached += r.CachedTokens
			}
			if o.sum.Errors != 0 {
				t.Fatalf("%s sessions %v: %d errors", policy, sessions, o.sum.Errors)
			}
			return o
		}
		lc := run(scheduler.PolicyLeastConnections, false)
		off := run(scheduler.PolicySluice, false)
		on := run(scheduler.PolicySluice, true)
		for _, x := range []struct {
			name string
			o    outcome
		}{{"least-connections", lc}, {"sluice, no session hint", off}, {"sluice + session hint", on}} {
			t.Logf("load %.0f%%, %-24s cached %9d tokens (%.1f%%), TTFT p50 %6.0f ms p99 %6.0f ms, herded at %d of %d scrapes (worst %.2f× mean)",
				100*load, x.name, x.o.cached, 100*x.o.sum.PromptCached, x.o.sum.TTFT.P50, x.o.sum.TTFT.P99, x.o.bal.Herded, x.o.bal.Scrapes, x.o.bal.WorstRatio)
		}
		// The goal of issue 22 was 1.3× least-connections' cached tokens;
		// on this fleet (KV caches of 8-32k tokens shared by dozens of
		// sessions, a 2,000-token system prompt every worker holds) it
		// is 1.07-1.10× (docs/routing.md, Agent sessions). What is held
		// here: more than least-connections, and the hint within 2% of
		// the prefix term alone.
		if on.cached <= lc.cached {
			t.Errorf("load %.0f%%: %d tokens cached with the hint, %d with least-connections: want more", 100*load, on.cached, lc.cached)
		}
		if float64(on.cached) < 0.98*float64(off.cached) {
			t.Errorf("load %.0f%%: %d tokens cached with the hint, %d without", 100*load, on.cached, off.cached)
		}
		if on.sum.TTFT.P99 > 1.05*off.sum.TTFT.P99 {
			t.Errorf("load %.0f%%: p99 TTFT %.0f ms with the hint, %.0f without", 100*load, on.sum.TTFT.P99, off.sum.TTFT.P99)
		}
		// Loads read at a scrape differ by how requests end, whatever the
		// policy (least-connections shows it at 9-14% of scrapes): the
		// hint must not add to it.
		if float64(on.bal.Herded) > 1.05*float64(off.bal.Herded)+5 {
			t.Errorf("load %.0f%%: a worker over 1.5× the mean while another idled at %d of %d scrapes with the hint, %d without", 100*load, on.bal.Herded, on.bal.Scrapes, off.bal.Herded)
		}
	}
}

// agentLoad is the fleet and load of the agent tests: the demo fleet and
// 3,000 requests of bench.Agent's defaults, seed 1.
func agentLoad(t *testing.T) ([]sim.WorkerSpec, []bench.Item) {
	t.Helper()
	base, err := bench.SynthesizeAgent(bench.Agent{Arrivals: bench.Arrivals{Rate: 1}, Count: 3000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return sim.DemoFleet(), base
}

// openLoop returns a copy of items that does not wait for answers: each
// arrives at its At.
func openLoop(items []bench.Item) []bench.Item {
	out := make([]bench.Item, len(items))
	copy(out, items)
	for i := range out {
		out[i].After, out[i].Pause = 0, 0
	}
	return out
}
