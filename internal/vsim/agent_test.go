package vsim

import (
	"fmt"
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// agentPolicy is one router of the agent tests.
type agentPolicy struct {
	name   string
	policy scheduler.Policy
	hint   bool // sessions.affinity
}

// The routers the agent tests compare: least-connections, and Sluice
// without and with the session hint (its default).
var agentPolicies = []agentPolicy{
	{"least-connections", scheduler.PolicyLeastConnections, false},
	{"sluice, no session hint", scheduler.PolicySluice, false},
	{"sluice + session hint", scheduler.PolicySluice, true},
}

// agentOutcome sums what a router got over runs.
type agentOutcome struct {
	runs                int
	cached, prompt      int
	p50, p99            float64 // summed over runs: divide by runs
	herded, scrapes     int
	worstRatio          float64
	stayed, nextTurns   int
	seed1p50, seed1p99  float64
	seed1Cached, seed1N int
}

func (o agentOutcome) share() float64   { return float64(o.cached) / float64(o.prompt) }
func (o agentOutcome) meanP99() float64 { return o.p99 / float64(o.runs) }

// runAgent runs items under p on fleet and adds the outcome to o.
func runAgent(t *testing.T, fleet []sim.WorkerSpec, items []bench.Item, p agentPolicy, o *agentOutcome, first bool) {
	t.Helper()
	rc := config.DefaultConfig()
	rc.Sessions.Affinity = p.hint
	cfg := FromRouterConfig(rc, fleet)
	cfg.Policy = p.policy
	res, st, err := RunStats(cfg, items)
	if err != nil {
		t.Fatal(err)
	}
	sum := bench.Summarize(res, bench.SLO{})
	if sum.Errors != 0 {
		t.Fatalf("%s: %d errors", p.name, sum.Errors)
	}
	cached, prompt := 0, 0
	last := map[string]string{}
	for _, i := range byStart(res) {
		r := res[i]
		cached += r.CachedTokens
		prompt += r.PromptTokens
		if w, ok := last[items[i].Session]; ok {
			o.nextTurns++
			if w == r.Worker {
				o.stayed++
			}
		}
		last[items[i].Session] = r.Worker
	}
	o.runs++
	o.cached += cached
	o.prompt += prompt
	o.p50 += sum.TTFT.P50
	o.p99 += sum.TTFT.P99
	o.herded += st.Balance.Herded
	o.scrapes += st.Balance.Scrapes
	o.worstRatio = max(o.worstRatio, st.Balance.WorstRatio)
	if first {
		o.seed1p50, o.seed1p99, o.seed1Cached, o.seed1N = sum.TTFT.P50, sum.TTFT.P99, cached, prompt
	}
}

// agentRuns runs every agentPolicies router on the agent load of each
// seed at load × capacity, and logs each router's first-seed run and its
// means.
func agentRuns(t *testing.T, fleet []sim.WorkerSpec, seeds []uint64, load float64, open bool) []agentOutcome {
	t.Helper()
	out := make([]agentOutcome, len(agentPolicies))
	for k, seed := range seeds {
		base, err := bench.SynthesizeAgent(bench.Agent{Arrivals: bench.Arrivals{Rate: 1}, Count: 3000, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if open {
			base = openLoop(base)
		}
		items, err := AtRate(base, load*Capacity(fleet, base))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range agentPolicies {
			runAgent(t, fleet, items, p, &out[i], k == 0)
		}
	}
	lc := out[0]
	for i, p := range agentPolicies {
		o := out[i]
		t.Logf("load %.0f%%, %-27s seed %d: cached %5.1f%% (%.2f× least-connections), TTFT p50 %4.0f p99 %5.0f ms | %d seeds: cached %5.1f%% (%.2f×), p50 %4.0f p99 %5.0f ms, kept %4.1f%% of next turns on their worker, herded at %d of %d scrapes (worst %.1f× mean)",
			100*load, p.name, seeds[0], 100*float64(o.seed1Cached)/float64(o.seed1N), (float64(o.seed1Cached)/float64(o.seed1N))/(float64(lc.seed1Cached)/float64(lc.seed1N)), o.seed1p50, o.seed1p99,
			o.runs, 100*o.share(), o.share()/lc.share(), o.p50/float64(o.runs), o.meanP99(), 100*float64(o.stayed)/float64(o.nextTurns), o.herded, o.scrapes, o.worstRatio)
	}
	return out
}

// TestRun_AgentSessions runs the coding-agent load (bench.Agent: sessions
// whose prompts grow by one turn, 90%+ of each prompt repeated, tool
// pauses of seconds and user pauses of minutes, each request sent once
// the answer before it has come) on the demo fleet at 50% and 80% of
// capacity, seeds 1-3, with the routers of agentPolicies, and holds, on
// the means over the seeds (a p99 over 3,000 requests moves more from one
// seed to the next than two routers this close differ):
//
//   - Sluice with the session hint finds at least 1.1× least-connections'
//     cached prompt tokens, within 2% of as many as without the hint,
//     with a p99 first token within 10% of it and no more than 10% more
//     scrapes where a worker runs two or more, over 1.5× the fleet's
//     mean, while another idles.
//
//     go test -run TestRun_AgentSessions -v ./internal/vsim/
func TestRun_AgentSessions(t *testing.T) {
	fleet, _ := agentLoad(t)
	seeds := []uint64{1, 2, 3} // one seed's p99 is too noisy to judge by
	for _, load := range []float64{0.5, 0.8} {
		o := agentRuns(t, fleet, seeds, load, false)
		lc, off, on := o[0], o[1], o[2]
		at := fmt.Sprintf("load %.0f%%", 100*load)
		if on.share() < 1.1*lc.share() {
			t.Errorf("%s: %.1f%% cached with the hint, %.1f%% with least-connections: want 1.1× at least", at, 100*on.share(), 100*lc.share())
		}
		if on.share() < 0.98*off.share() {
			t.Errorf("%s: %.1f%% cached with the hint, %.1f%% without", at, 100*on.share(), 100*off.share())
		}
		if on.meanP99() > 1.1*off.meanP99() {
			t.Errorf("%s: p99 TTFT %.0f ms with the hint, %.0f without", at, on.meanP99(), off.meanP99())
		}
		if float64(on.herded) > 1.1*float64(off.herded)+5 {
			t.Errorf("%s: a worker over 1.5× the mean while another idled at %d of %d scrapes with the hint, %d without", at, on.herded, on.scrapes, off.herded)
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
