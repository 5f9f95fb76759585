package vsim

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// agentPolicy is one router of the agent tests.
type agentPolicy struct {
	name      string
	policy    scheduler.Policy
	hint      bool    // sessions.affinity
	predicted bool    // admission.predicted_affinity
	herd      float64 // admission.affinity_herd (0: no bound)
}

// The routers the agent tests compare: least-connections, Sluice without
// and with the session hint (its default), with predicted affinity, and
// with predicted affinity but no no-herding bound (what the bound costs).
var agentPolicies = []agentPolicy{
	{"least-connections", scheduler.PolicyLeastConnections, false, false, scheduler.DefaultAffinityHerd},
	{"sluice, no session hint", scheduler.PolicySluice, false, false, scheduler.DefaultAffinityHerd},
	{"sluice + session hint", scheduler.PolicySluice, true, false, scheduler.DefaultAffinityHerd},
	{"+ predicted_affinity", scheduler.PolicySluice, true, true, scheduler.DefaultAffinityHerd},
	{"+ predicted, no herd bound", scheduler.PolicySluice, true, true, 0},
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
	rc.Sessions.Affinity, rc.Admission.PredictedAffinity, rc.Admission.AffinityHerd = p.hint, p.predicted, p.herd
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
// the means over the seeds (a p99 over 3,000 requests moves by up to 15%
// from one seed to the next between two routers this close):
//
//   - Sluice with the session hint finds at least 1.1× least-connections'
//     cached prompt tokens, within 2% of as many as without the hint,
//     with a p99 first token within 10% of it and no more than 10% more
//     scrapes where a worker runs two or more, over 1.5× the fleet's
//     mean, while another idles;
//   - predicted affinity finds more than both, with a p99 within 5% of
//     Sluice without the hint and herding within the same 10%;
//   - without the no-herding bound it finds at least 1.25× least-
//     connections', and herds at least 30% more often: the bound is what
//     holds the rest back (docs/routing.md, Agent sessions).
//
// The goal, 1.3× least-connections', is not met with the bound
// kept: the test says by how much.
//
//	go test -run TestRun_AgentSessions -v ./internal/vsim/
func TestRun_AgentSessions(t *testing.T) {
	fleet, _ := agentLoad(t)
	seeds := []uint64{1, 2, 3} // one seed's p99 is too noisy to judge by
	for _, load := range []float64{0.5, 0.8} {
		o := agentRuns(t, fleet, seeds, load, false)
		lc, off, on, pa, free := o[0], o[1], o[2], o[3], o[4]
		at := fmt.Sprintf("load %.0f%%", 100*load)
		t.Logf("%s: the goal, 1.3× least-connections' cached tokens: %.2f× with the session hint, %.2f× with predicted affinity, %.2f× without the no-herding bound", at, on.share()/lc.share(), pa.share()/lc.share(), free.share()/lc.share())
		if on.share() < 1.1*lc.share() {
			t.Errorf("%s: %.1f%% cached with the hint, %.1f%% with least-connections: want 1.1× at least", at, 100*on.share(), 100*lc.share())
		}
		if on.share() < 0.98*off.share() {
			t.Errorf("%s: %.1f%% cached with the hint, %.1f%% without", at, 100*on.share(), 100*off.share())
		}
		if on.meanP99() > 1.1*off.meanP99() {
			t.Errorf("%s: p99 TTFT %.0f ms with the hint, %.0f without", at, on.meanP99(), off.meanP99())
		}
		if pa.share() <= on.share() || pa.share() <= off.share() {
			t.Errorf("%s: %.1f%% cached with predicted affinity, %.1f%% with the hint alone, %.1f%% without: want more than both", at, 100*pa.share(), 100*on.share(), 100*off.share())
		}
		if pa.meanP99() > 1.05*off.meanP99() {
			t.Errorf("%s: p99 TTFT %.0f ms with predicted affinity, %.0f without the hint", at, pa.meanP99(), off.meanP99())
		}
		for _, x := range []struct {
			name string
			o    agentOutcome
		}{{"the hint", on}, {"predicted affinity", pa}} {
			if float64(x.o.herded) > 1.1*float64(off.herded)+5 {
				t.Errorf("%s: a worker over 1.5× the mean while another idled at %d of %d scrapes with %s, %d without the hint", at, x.o.herded, x.o.scrapes, x.name, off.herded)
			}
		}
		if free.share() < 1.25*lc.share() || float64(free.herded) < 1.3*float64(pa.herded) {
			t.Errorf("%s: without the no-herding bound %.1f%% cached (%.2f× least-connections), herded at %d scrapes against %d: want ≥ 1.25× and 30%% more often", at, 100*free.share(), free.share()/lc.share(), free.herded, pa.herded)
		}
	}
}

// TestRun_AgentSessionsOtherFleetAndOpenLoop runs the same routers,
// seed 1, on eight cards of 131,072 KV tokens each, and on the demo
// fleet with the load sent at its open-loop times (each request at its
// At, not after the answer it follows), as the load generator did before
// it waited for answers. They are reported, not tuned on: only that
// predicted affinity finds more than the hint alone is held.
func TestRun_AgentSessionsOtherFleetAndOpenLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("4 runs of 3,000 requests per router")
	}
	demo, _ := agentLoad(t)
	for _, v := range []struct {
		name  string
		fleet []sim.WorkerSpec
		open  bool
	}{{"8 × 131k", bigKVFleet(8, 131072), false}, {"demo fleet, open loop", demo, true}} {
		for _, load := range []float64{0.5, 0.8} {
			t.Logf("%s:", v.name)
			o := agentRuns(t, v.fleet, []uint64{1}, load, v.open)
			if o[3].share() <= o[2].share() {
				t.Errorf("%s, load %.0f%%: %.1f%% cached with predicted affinity, %.1f%% with the hint alone", v.name, 100*load, 100*o[3].share(), 100*o[2].share())
			}
		}
	}
}

// bigKVFleet is n default workers of kv KV tokens each, as a fleet file
// of n {kv_tokens: kv} entries gives.
func bigKVFleet(n, kv int) []sim.WorkerSpec {
	out := make([]sim.WorkerSpec, n)
	for i := range out {
		p := sim.DefaultParams()
		p.KVTokens, p.Seed, p.StartupDelay = kv, int64(i+1), 2*time.Second
		out[i] = sim.WorkerSpec{Name: "gpu-" + strconv.Itoa(i), Params: p}
	}
	return out
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
