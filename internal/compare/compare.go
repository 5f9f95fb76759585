package compare

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// Options are the settings of a comparison: the flags of `sluice bench
// compare`.
type Options struct {
	Virtual        bool
	Trace          string
	Limit          int
	Offset         int
	Seed           uint64
	Loads          []float64
	Burst          bool
	BurstAt        time.Duration
	BurstFor       time.Duration
	BurstFactor    float64
	Policies       []scheduler.Policy
	TimeScale      float64
	MaxConcurrency int
	FleetFile      string
	Out            string
	Timeout        time.Duration
	// Replicas, above 1, adds the row "sluice ×N": N routers sharing the
	// fleet through Redis (redis, or a private redis-server when empty)
	// behind a round-robin front, next to the one-router row.
	Replicas int
	Redis    string
	// Router, when set, supplies weights, admission, telemetry and stats
	// settings (and max_concurrency) instead of the defaults.
	Router *config.Config
	// SLO is the objective every run is judged by (bench.DefaultSLO).
	SLO bench.SLO
	// Goodput scans loads in steps of 5% for the highest one each policy
	// serves within the SLO (virtual time only).
	Goodput bool
	// Seeds, above 1, runs every load again for the Seeds-1 seeds after
	// Seed, Sluice and least-connections only, and writes the spread of
	// Sluice's ratios to least-connections' over all of them (virtual
	// time only).
	Seeds int
	// IdleFloor replays the rows alone on copies of the fleet's fastest
	// worker (virtual time only): the least time to first token any
	// router could give them, which each load's p99 goal is judged
	// against.
	IdleFloor bool
	// Workers, when set, are running engines (kind llamacpp) to compare
	// on instead of a sim fleet, on the wall clock.
	Workers []config.Worker
	// Capacity, above 0, is the fleet's Capacity in req/s that --loads
	// are percentages of, instead of vsim.Capacity's estimate of the sim
	// fleet; required with workers.
	Capacity float64
	// KVEvents adds the row "sluice + KV events": Sluice with the exact
	// index of the engines' KV-cache events (over real HTTP the sim
	// fleet publishes them over ZeroMQ and the router reads prompts'
	// token ids from its /tokenize), and a table of what each row's
	// router expected cached against what the engines found.
	KVEvents bool
	// BuiltinTrace is the load of Trace "auto" (a trace file's bytes,
	// the binary's own), and BuiltinTraceName what reports call it.
	BuiltinTrace     []byte
	BuiltinTraceName string
}

// scenario is one load of a comparison: the same items for every policy.
type scenario struct {
	name  string // directory name, e.g. "load-80"
	title string
	items []bench.Item
	rate  float64 // mean arrival rate, req/s
}

// checkWorkers rejects what --workers cannot do: run in virtual time, or
// guess the capacity of engines it cannot model.
func checkWorkers(o Options) error {
	switch {
	case len(o.Workers) == 0:
		return nil
	case o.Virtual:
		return errors.New("--workers is real HTTP only: virtual time simulates a sim fleet, not running engines")
	case o.Capacity <= 0:
		return errors.New("--workers needs --capacity REQ_PER_S: the loads are percentages of the fleet's capacity, which only a measurement of real engines can give (see docs/benchmarks.md)")
	}
	return nil
}

// checkReplicas rejects --replicas and --redis where they cannot apply.
func checkReplicas(o Options) error {
	switch {
	case o.Replicas < 0:
		return fmt.Errorf("--replicas %d: want 1 (one router) or more", o.Replicas)
	case o.Replicas > 1 && o.Virtual:
		return errors.New("--replicas is real HTTP only: replicas share state through Redis, which virtual time does not simulate")
	case o.Replicas <= 1 && o.Redis != "":
		return errors.New("--redis is for --replicas above 1")
	}
	return nil
}

// LoadItems reads the trace (or synthesises a load) that every scenario
// rescales; it also says where the load came from.
func LoadItems(o Options) ([]bench.Item, string, error) {
	path := o.Trace
	if path == "auto" {
		if o.BuiltinTrace == nil {
			return nil, "", errors.New(`--trace auto: this build has no built-in trace; name a trace file`)
		}
		items, err := bench.ParseTrace(bytes.NewReader(o.BuiltinTrace), "azure_conv_2000.csv", bench.TraceOptions{Offset: o.Offset, Limit: o.Limit, Seed: o.Seed})
		desc := fmt.Sprintf("%s, rows %d..%d", o.BuiltinTraceName, o.Offset+1, o.Offset+len(items))
		fmt.Fprintf(os.Stderr, "load: %s (--trace FILE for another)\n", desc)
		return items, desc, err
	}
	if path == "synthetic" {
		items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: o.Limit, Seed: o.Seed})
		return items, fmt.Sprintf("synthetic Poisson, %d requests, default lengths, seed %d", o.Limit, o.Seed), err
	}
	if path == "synthetic-code" {
		items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: o.Limit, Seed: o.Seed, Prompt: bench.CodePromptLengths, Output: bench.CodeOutputLengths})
		return items, fmt.Sprintf("synthetic code completion (Poisson; prompts median 1,500 tokens, mean ~2,000; answers median 13, mean ~27), %d requests, seed %d", o.Limit, o.Seed), err
	}
	if path == "synthetic-chat" {
		items, err := bench.SynthesizeChat(bench.Chat{Arrivals: bench.Arrivals{Rate: 1}, Count: o.Limit, Seed: o.Seed})
		return items, fmt.Sprintf("synthetic multi-turn chat (bench.Chat defaults: mean 4 turns, 30 s think time, 4 shared 1,000-token system prompts, 128-token blocks), %d requests, seed %d", o.Limit, o.Seed), err
	}
	if path == "synthetic-agent" {
		items, err := bench.SynthesizeAgent(bench.Agent{Arrivals: bench.Arrivals{Rate: 1}, Count: o.Limit, Seed: o.Seed})
		return items, fmt.Sprintf("synthetic coding agent (bench.Agent defaults: sessions of 16 requests on average, each resending the conversation so far, a shared 2,000-token system prompt, tool pauses of 3 s and user pauses of 3 minutes, each request sent after the answer it follows), %d requests, seed %d", o.Limit, o.Seed), err
	}
	// Traces of lengths only (ShareGPT, arXiv) get Poisson arrivals; each
	// scenario rescales them to its load.
	items, err := vsim.ReadLoad(path, bench.TraceOptions{Offset: o.Offset, Limit: o.Limit, Seed: o.Seed, Arrivals: bench.Arrivals{Rate: 1}})
	return items, fmt.Sprintf("%s, rows %d..%d", path, o.Offset+1, o.Offset+len(items)), err
}

// scenarios builds the loads from the base items and the fleet capacity.
func scenarios(o Options, items []bench.Item, capacity float64) ([]scenario, error) {
	var out []scenario
	for _, l := range o.Loads {
		rate := l / 100 * capacity
		it, err := vsim.AtRate(items, rate)
		if err != nil {
			return nil, err
		}
		out = append(out, scenario{name: fmt.Sprintf("load-%g", l), title: fmt.Sprintf("%g%% of capacity (%.2f req/s)", l, rate), items: it, rate: rate})
	}
	if o.Burst {
		rate := 0.5 * capacity
		it, err := vsim.AtRate(items, rate)
		if err != nil {
			return nil, err
		}
		it = vsim.Burst(it, o.BurstAt, o.BurstFor, o.BurstFactor)
		out = append(out, scenario{name: "burst", rate: rate, items: it,
			title: fmt.Sprintf("burst: 50%% of capacity (%.2f req/s), ×%g for %v from %v (%.0f%% of capacity)", rate, o.BurstFactor, o.BurstFor, o.BurstAt, 50*o.BurstFactor)})
	}
	return out, nil
}

// Run runs every scenario under every policy and writes the
// reports; progress goes to logw.
func Run(ctx context.Context, o Options, logw *os.File) error {
	if err := checkReplicas(o); err != nil {
		return err
	}
	if err := checkWorkers(o); err != nil {
		return err
	}
	if err := checkSeeds(o); err != nil {
		return err
	}
	switch {
	case o.KVEvents && len(o.Workers) > 0:
		return errors.New("--kv-events is for a sim fleet, which publishes its KV-cache events to the router; running workers publish theirs where their own config says (workers[].kv_events in sluice serve)")
	case o.KVEvents && o.Replicas > 1:
		return errors.New("--kv-events runs one router against the sim fleet: not with --replicas")
	}
	fleet := sim.DemoFleet()
	fleetName := "sim.DemoFleet() (gpu-0, gpu-1 reference A100; gpu-2-slow speed 0.6; gpu-3-small-kv 8,192 KV tokens)"
	if len(o.Workers) > 0 {
		fleet = nil
		var ws []string
		for _, w := range o.Workers {
			ws = append(ws, fmt.Sprintf("%s %s (%s)", w.Name, w.URL, w.Kind))
		}
		fleetName = "running workers " + strings.Join(ws, ", ")
	} else if o.FleetFile != "" {
		var err error
		if fleet, err = sim.ParseFleetFile(o.FleetFile); err != nil {
			return err
		}
		fleetName = o.FleetFile
	}
	items, load, err := LoadItems(o)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return errors.New("the load is empty")
	}
	capacity := o.Capacity
	capacityLine := "Fleet capacity: %.2f req/s (given with --capacity)"
	if capacity <= 0 {
		capacity = vsim.Capacity(fleet, items)
		capacityLine = "Estimated fleet capacity: %.2f req/s (vsim.Capacity: every slot busy, mean prompt and output of the rows, mean interference)"
	}
	scens, err := scenarios(o, items, capacity)
	if err != nil {
		return err
	}
	var floor *idleFloor
	if o.IdleFloor {
		if !o.Virtual {
			return errors.New("--idle-floor is virtual only: it replays the rows on a fleet of copies of the fastest simulated worker")
		}
		fmt.Fprintf(logw, "idle floor: %d requests alone on copies of the fastest worker\n", len(items))
		if floor, err = measureIdleFloor(ctx, o, fleet, items, capacity, logw); err != nil {
			return err
		}
	}
	redisDesc := ""
	if o.Replicas > 1 {
		if o.Redis == "" {
			r, err := startPrivateRedis(ctx)
			if err != nil {
				return err
			}
			defer r.Stop()
			o.Redis = r.URL()
			redisDesc = "a private redis-server on " + r.addr + ", started for the run"
			fmt.Fprintf(logw, "redis: started a private redis-server on %s for the %d replicas; it stops at the end (--redis URL to use another)\n", r.addr, o.Replicas)
		} else {
			redisDesc = redisconn.Redact(o.Redis)
			fmt.Fprintf(logw, "redis: the %d replicas share %s (keys under a prefix of each run's own, deleted at its end)\n", o.Replicas, redisDesc)
		}
	}
	mode := fmt.Sprintf("real HTTP on loopback (sim fleet at time scale %g; times converted back to model time)", o.TimeScale)
	switch {
	case o.Virtual:
		mode = "virtual time (internal/vsim)"
	case len(o.Workers) > 0:
		mode = "real HTTP against running workers (wall-clock time: time scale 1)"
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Sluice policy comparison\n\n")
	fmt.Fprintf(&md, "- Mode: %s\n- Fleet: %s\n- Load: %s\n- Seed: %d\n", mode, fleetName, load, o.Seed)
	fmt.Fprintf(&md, "- "+capacityLine+"\n", capacity)
	mc := "auto (learned below each worker's slot count)"
	if o.MaxConcurrency > 0 {
		mc = "learned below a cap of " + strconv.Itoa(o.MaxConcurrency)
	}
	admission := "max_queue 256, queue_timeout 30s, default weights (config defaults)"
	if o.Router != nil {
		admission = fmt.Sprintf("max_queue %d, queue_timeout %v, weights.prefix %v (from --config)", o.Router.Admission.MaxQueue, o.Router.Admission.QueueTimeout, o.Router.Weights.Prefix)
		if !o.Router.Admission.KVFit {
			admission += ", admission.kv_fit off"
		}
	}
	fmt.Fprintf(&md, "- Sluice max_concurrency: %s; baselines ignore it. Router: %s.\n", mc, admission)
	if floor != nil {
		fmt.Fprintf(&md, "- Idle floor (--idle-floor): the same rows alone on %d copies of %s at 1%% of capacity give TTFT p50 %.1f ms, p99 %.1f ms: no router gives these requests an earlier first token.\n",
			len(fleet), floor.worker, floor.p50, floor.p99)
	}
	if o.Replicas > 1 {
		fmt.Fprintf(&md, "- Row \"%s\": %d Sluice routers in this process sharing the fleet through %s — the reservation ledger (shared.redis) and the stats store (stats.store) — behind a round-robin HTTP front on loopback (request i to replica i mod %d); the other rows are one router each, without the front.\n",
			replicasRow(o.Replicas), o.Replicas, redisDesc, o.Replicas)
	}
	fmt.Fprintln(&md)

	first := map[string]ratios{} // Sluice against least-connections, by scenario, for --seeds
	for _, sc := range scens {
		var runs []bench.NamedRun
		var limits []scheduler.WorkerState
		var one, many, kvHTTP *vsim.HTTPStats
		expected := map[string]int64{}
		balance := map[string]*vsim.Balance{}
		add := func(name string, r policyRun) {
			expected[name], balance[name] = r.expected, r.balance
			runs = append(runs, bench.NamedRun{Name: name, Results: r.res, SLO: o.SLO})
		}
		for _, p := range o.Policies {
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, p, len(sc.items))
			r, err := runPolicy(ctx, o, fleet, p, 1, false, sc.items, logw)
			if err != nil {
				return fmt.Errorf("%s, policy %s: %w", sc.name, p, err)
			}
			if p == scheduler.PolicySluice {
				limits, one = r.workers, r.http
			}
			add(string(p), r)
		}
		if o.Replicas > 1 {
			name := replicasRow(o.Replicas)
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, name, len(sc.items))
			r, err := runPolicy(ctx, o, fleet, scheduler.PolicySluice, o.Replicas, false, sc.items, logw)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", sc.name, name, err)
			}
			many = r.http
			add(name, r)
		}
		if o.KVEvents {
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, KVRow, len(sc.items))
			r, err := runPolicy(ctx, o, fleet, scheduler.PolicySluice, 1, true, sc.items, logw)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", sc.name, KVRow, err)
			}
			kvHTTP = r.http
			add(KVRow, r)
		}
		dir := filepath.Join(o.Out, sc.name)
		if _, err := bench.WriteReport(dir, runs); err != nil {
			return err
		}
		for _, r := range runs {
			if err := bench.WriteFile(filepath.Join(dir, csvName(r.Name)), func(f *os.File) error { return bench.WriteCSV(f, r.Results) }); err != nil {
				return err
			}
		}
		fmt.Fprintf(&md, "## %s\n\nReport: [%s/%s](%s/%s)\n\n```\n", sc.title, sc.name, bench.ReportFile, sc.name, bench.ReportFile)
		if err := bench.WriteCompareTable(&md, runs); err != nil {
			return err
		}
		fmt.Fprintf(&md, "```\n\n")
		writeGoals(&md, sc, runs, o.Virtual, o.TimeScale, floor)
		writeBalance(&md, runs, balance)
		if err := writeSlowdowns(&md, o, fleet, runs, sc.items); err != nil {
			return err
		}
		if o.Seeds > 1 {
			first[sc.name] = withSpell(ratiosOf(summaryOf(runs, scheduler.PolicySluice), summaryOf(runs, scheduler.PolicyLeastConnections)), fleet, runs)
		}
		writeReplicas(&md, runs, one, many)
		if o.KVEvents {
			writeExpectedCached(&md, runs, expected, o.Virtual)
			writeKVState(&md, kvHTTP, len(sc.items))
		}
		writeLimits(&md, limits)
	}
	if o.Goodput {
		if err := writeGoodput(ctx, &md, o, fleet, items, capacity, logw); err != nil {
			return err
		}
	}
	if o.Seeds > 1 {
		if err := writeSeeds(ctx, &md, o, fleet, first, logw); err != nil {
			return err
		}
	}
	path := filepath.Join(o.Out, "summary.md")
	if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	os.Stdout.Write(md.Bytes())
	fmt.Fprintf(logw, "wrote %s\n", path)
	return nil
}

// goodputStep and goodputMax bound the goodput scan, in % of capacity;
// goodputShare is the share of requests that must meet the SLO.
const (
	goodputStep  = 5
	goodputMax   = 150
	goodputShare = 0.95
)

// goodput returns the highest load, in steps of goodputStep % of
// capacity up to goodputMax, at which policy p serves at least
// goodputShare of the items within the SLO (refused and failed requests
// count as missed), and the attainment there; 0 when no step does.
func goodput(ctx context.Context, o Options, fleet []sim.WorkerSpec, p scheduler.Policy, items []bench.Item, capacity float64, logw *os.File) (float64, float64, error) {
	best, at := 0.0, 0.0
	for l := goodputStep; l <= goodputMax; l += goodputStep {
		it, err := vsim.AtRate(items, float64(l)/100*capacity)
		if err != nil {
			return 0, 0, err
		}
		r, err := runPolicy(ctx, o, fleet, p, 1, false, it, logw)
		if err != nil {
			return 0, 0, err
		}
		if a := bench.Summarize(r.res, o.SLO).Attainment; a >= goodputShare {
			best, at = float64(l), a
		}
	}
	return best, at, nil
}

// writeGoodput scans every policy's goodput and writes the table.
func writeGoodput(ctx context.Context, md *bytes.Buffer, o Options, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) error {
	if !o.Virtual {
		return errors.New("--goodput is virtual only: it runs every load from 5% to 150% of capacity")
	}
	fmt.Fprintf(md, "## Goodput\n\nThe highest load, in steps of %d%% of the estimated capacity up to %d%%, at which at least %.0f%% of requests meet the SLO (%s; refused and failed requests miss it):\n\n| policy | goodput (%% of capacity) | req/s | attainment there |\n| --- | ---: | ---: | ---: |\n",
		goodputStep, goodputMax, 100*goodputShare, o.SLO)
	for _, p := range o.Policies {
		fmt.Fprintf(logw, "goodput: %s\n", p)
		l, a, err := goodput(ctx, o, fleet, p, items, capacity, logw)
		if err != nil {
			return fmt.Errorf("goodput, policy %s: %w", p, err)
		}
		fmt.Fprintf(md, "| %s | %.0f%% | %.2f | %.1f%% |\n", p, l, l/100*capacity, 100*a)
	}
	fmt.Fprintln(md)
	return nil
}

// policyRun is what one policy's run gave: the requests' results and
// what the router and fleet said of it.
type policyRun struct {
	res []bench.Result
	// workers are the (first) router's worker states at the end: limit
	// in force, learned limit, cap and why.
	workers []scheduler.WorkerState
	// expected is the prompt tokens the router expected the chosen
	// workers to hold, over its bound decisions.
	expected int64
	// balance is how evenly the run spread requests, scrape by scrape
	// (virtual time only).
	balance *vsim.Balance
	// http is what the real-HTTP run measured (nil in virtual time).
	http *vsim.HTTPStats
}

// runPolicy runs one scenario under one policy, with a fresh fleet, in
// virtual time or over real HTTP through that many router replicas; with
// kv, the fleet publishes its KV-cache events to the router.
func runPolicy(ctx context.Context, o Options, fleet []sim.WorkerSpec, p scheduler.Policy, replicas int, kv bool, items []bench.Item, logw *os.File) (policyRun, error) {
	cfg := vsim.DefaultConfig(fleet)
	if o.Router != nil {
		cfg = vsim.FromRouterConfig(*o.Router, fleet)
	}
	cfg.Policy, cfg.Seed, cfg.MaxConcurrency = p, o.Seed, o.MaxConcurrency
	if o.Virtual {
		cfg.KVEvents = kv
		res, st, err := vsim.RunStats(cfg, items)
		return policyRun{res: res, workers: st.Workers, expected: st.ExpectedCached, balance: &st.Balance}, err
	}
	hc := vsim.HTTPConfig{Router: cfg, TimeScale: o.TimeScale, Timeout: o.Timeout, External: o.Workers, KVEvents: kv,
		Progress: bench.ProgressBar(logw, term.IsTerminal(int(logw.Fd())))}
	if replicas > 1 {
		hc.Replicas, hc.Redis = replicas, o.Redis
	}
	res, hs, err := vsim.RunHTTPStats(ctx, hc, items)
	// The first router's limits at the end, as the virtual run reports
	// them: what held requests in its queue, against real workers too.
	return policyRun{res: res, workers: hs.Workers, expected: hs.ExpectedCached, http: &hs}, err
}

// replicasRow names the row of n replicas.
func replicasRow(n int) string { return fmt.Sprintf("sluice ×%d", n) }

// csvName is the file of a run's rows: its name, "sluice ×3" as
// "sluice-x3".
func csvName(run string) string {
	return strings.NewReplacer(" ×", "-x", " ", "-", "/", "-").Replace(run) + ".csv"
}

// writeReplicas sets the replicas' row against the one router's and
// states what they kept: the workers' limits across replicas, every
// request decided once by a replica naming itself, every reservation
// released.
func writeReplicas(md *bytes.Buffer, runs []bench.NamedRun, one, many *vsim.HTTPStats) {
	if many == nil {
		return
	}
	sum := map[string]bench.Summary{}
	var name string
	for _, r := range runs {
		sum[r.Name] = r.Summary()
		if strings.HasPrefix(r.Name, "sluice ×") {
			name = r.Name
		}
	}
	m := sum[name]
	fmt.Fprintf(md, "%d replicas against one:\n\n", len(many.Replicas))
	if s, ok := sum[string(scheduler.PolicySluice)]; ok {
		ratio := func(a, b float64) string {
			if b == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", a/b)
		}
		fmt.Fprintf(md, "| | sluice | %s | ratio |\n| --- | ---: | ---: | ---: |\n", name)
		fmt.Fprintf(md, "| TTFT p50 (ms) | %.0f | %.0f | %s |\n", s.TTFT.P50, m.TTFT.P50, ratio(m.TTFT.P50, s.TTFT.P50))
		fmt.Fprintf(md, "| TTFT p99 (ms) | %.0f | %.0f | %s |\n", s.TTFT.P99, m.TTFT.P99, ratio(m.TTFT.P99, s.TTFT.P99))
		fmt.Fprintf(md, "| output (tok/s) | %.1f | %.1f | %s |\n", s.OutputTokensPerSec, m.OutputTokensPerSec, ratio(m.OutputTokensPerSec, s.OutputTokensPerSec))
		fmt.Fprintf(md, "| errors | %d | %d | |\n\n", s.Errors, m.Errors)
	}
	peaks := func(st *vsim.HTTPStats) string {
		var parts []string
		over := false
		for _, w := range st.Workers {
			p := st.PeakInFlight[w.Name]
			parts = append(parts, fmt.Sprintf("%s %d of %d", w.Name, p, w.Cap))
			over = over || p > w.Cap
		}
		out := strings.Join(parts, ", ")
		if over {
			out += " — **over a worker's cap**"
		}
		return out
	}
	fmt.Fprintf(md, "- most requests open at once on each worker, all replicas together, against its cap: %s\n", peaks(many))
	if one != nil && len(one.Workers) > 0 {
		fmt.Fprintf(md, "- the same for one router: %s\n", peaks(one))
	}
	bound, sent := 0, 0
	for _, r := range many.Replicas {
		bound += r.Bound
		sent += r.Sent
		fmt.Fprintf(md, "- %s: sent %d, bound %d, refused %d, records not naming it %d, degraded %d, oldest shared state used %.0f ms (wall)\n",
			r.Name, r.Sent, r.Bound, r.Refused, r.Misnamed, r.Degraded, r.MaxStateAgeMs)
	}
	fmt.Fprintf(md, "- requests %d, sent by the front %d, bound (retries included) %d; in flight in the shared ledger after the run: %d\n\n", m.Count, sent, bound, many.LeftInFlight)
}

// writeLimits lists where each worker's concurrency limit ended a run and
// why, so a report shows what the controller learned.
func writeLimits(md *bytes.Buffer, ws []scheduler.WorkerState) {
	if len(ws) == 0 {
		return
	}
	fmt.Fprintf(md, "Sluice's concurrency limits at the end of the run, and how its predictions held up (median |predicted − actual| / actual over each worker's last 32 requests, worker-side time to first token and decode rate):\n\n| worker | limit | learned | cap | why | TTFT error | decode error |\n| --- | ---: | ---: | ---: | --- | ---: | ---: |\n")
	for _, w := range ws {
		te, de := "-", "-"
		if p := w.Prediction; p != nil && p.TTFTN > 0 {
			te = fmt.Sprintf("%.0f%%", 100*p.TTFTError)
		}
		if p := w.Prediction; p != nil && p.DecodeN > 0 {
			de = fmt.Sprintf("%.0f%%", 100*p.DecodeError)
		}
		fmt.Fprintf(md, "| %s | %d | %d | %d | %s | %s | %s |\n", w.Name, w.Limit, w.Learned, w.Cap, w.LimitReason, te, de)
	}
	fmt.Fprintln(md)
	if line := runErrors(ws); line != "" {
		fmt.Fprintf(md, "%s\n\n", line)
	}
}

// median is a tally's median in percent, "-" when it is empty.
func median(t *predict.Tally) string {
	if t.N() == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*t.Median())
}

// runErrors states how the predictions held up over the whole run, every
// worker's recorded predictions together and then each worker's, or ""
// when none were recorded.
func runErrors(ws []scheduler.WorkerState) string {
	var all, allD predict.Tally
	var per []string
	for _, w := range ws {
		if w.Prediction == nil {
			continue
		}
		t, d := w.Prediction.RunTTFT, w.Prediction.RunDecode
		all.Merge(&t)
		allD.Merge(&d)
		if t.N() > 0 || d.N() > 0 {
			per = append(per, w.Name+" "+median(&t)+" / "+median(&d))
		}
	}
	if all.N() == 0 && allD.N() == 0 {
		return ""
	}
	return fmt.Sprintf("Over the whole run, median |predicted − actual| / actual of the worker-side time to first token: %.1f%% (p90 %.0f%%, %d requests); of the decode rate: %.1f%% (p90 %.0f%%, %d requests). Per worker, TTFT / decode: %s.",
		100*all.Median(), 100*all.Quantile(0.9), all.N(), 100*allD.Median(), 100*allD.Quantile(0.9), allD.N(), strings.Join(per, ", "))
}

// writeGoals states Sluice's goals against the measured numbers.
func writeGoals(md *bytes.Buffer, sc scenario, runs []bench.NamedRun, virtual bool, timeScale float64, floor *idleFloor) {
	sum := map[string]bench.Summary{}
	var sluiceRes []bench.Result
	for _, r := range runs {
		sum[r.Name] = r.Summary()
		if r.Name == string(scheduler.PolicySluice) {
			sluiceRes = r.Results
		}
	}
	s, ok := sum[string(scheduler.PolicySluice)]
	if !ok {
		return
	}
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "**not met**"
	}
	fmt.Fprintf(md, "Goals for Sluice:\n\n")
	if lc, ok := sum[string(scheduler.PolicyLeastConnections)]; ok {
		// The four goals against least-connections, to be met at once.
		ttft := s.TTFT.P99 / lc.TTFT.P99
		p1 := s.DecodeRate.P1 / lc.DecodeRate.P1
		thr := s.OutputTokensPerSec / lc.OutputTokensPerSec
		all := ttft <= 0.5 && p1 >= 2 && thr >= 0.97 && s.DecodeRate.CV <= 0.25
		fmt.Fprintf(md, "- p99 TTFT %.0f ms vs least-connections %.0f ms: ratio %.2f (goal ≤ 0.5) — %s\n", s.TTFT.P99, lc.TTFT.P99, ttft, verdict(ttft <= 0.5))
		if floor != nil {
			reach := "not ruled out by it"
			if floor.p99 > 0.5*lc.TTFT.P99 {
				reach = "out of reach of any router"
			}
			fmt.Fprintf(md, "  - the idle floor's p99 is %.0f ms, %.2f× least-connections': the goal is %s\n", floor.p99, floor.p99/lc.TTFT.P99, reach)
		}
		fmt.Fprintf(md, "- p1 decode rate %.1f tok/s vs least-connections %.1f: ratio %.2f (goal ≥ 2) — %s\n", s.DecodeRate.P1, lc.DecodeRate.P1, p1, verdict(p1 >= 2))
		fmt.Fprintf(md, "- throughput %.1f output tok/s vs least-connections %.1f: %.1f%% (goal ≥ 97%%) — %s\n", s.OutputTokensPerSec, lc.OutputTokensPerSec, 100*thr, verdict(thr >= 0.97))
		fmt.Fprintf(md, "- decode-rate CV %.2f (least-connections %.2f; goal ≤ 0.25) — %s\n", s.DecodeRate.CV, lc.DecodeRate.CV, verdict(s.DecodeRate.CV <= 0.25))
		fmt.Fprintf(md, "- all four at once — %s\n", verdict(all))
	}
	fmt.Fprintf(md, "- p99/p50 of time per output token: %.2f (goal ≤ 1.5 on Poisson arrivals at 80%% load) — %s\n", s.TPOT.TailRatio, verdict(s.TPOT.TailRatio <= 1.5))
	if sc.name == "burst" {
		other := 0
		for k, n := range s.ErrorsByKind {
			if k != "refused 429" && k != "refused 503" {
				other += n
			}
		}
		fmt.Fprintf(md, "- failures other than its own 429/503: %d (%v) — %s\n", other, s.ErrorsByKind, verdict(other == 0))
		fmt.Fprintf(md, "- refusals by reason: %v\n", s.Refusals)
		// Requests bound at one instant (a borrowing step places several)
		// differ by float rounding of their recorded waits: a microsecond
		// covers it.
		slack := time.Microsecond
		if !virtual {
			slack = time.Duration(2 * float64(time.Millisecond) * timeScale)
		}
		inv := vsim.FIFOInversions(sluiceRes, slack)
		fmt.Fprintf(md, "- queued requests bound more than %v before an earlier arrival: %d (priorities, fair share and the cost order may reorder within max_overtake)\n\n", slack, inv)
		return
	}
	fmt.Fprintf(md, "- errors: %d %v\n\n", s.Errors, s.ErrorsByKind)
}

// idleFloor is what the rows of a comparison get with the fleet idle:
// each request alone on a copy of the fleet's fastest worker.
type idleFloor struct {
	worker   string  // the worker copied
	p50, p99 float64 // time to first token, ms
}

// idleFloorLoad is the load, in % of capacity, at which the idle floor
// replays the rows: low enough that requests almost never overlap, and
// with as many workers as the fleet an overlap finds an idle one.
const idleFloorLoad = 1

// measureIdleFloor is the idle floor of items on fleet (idleFloorRun),
// summarised.
func measureIdleFloor(ctx context.Context, o Options, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) (*idleFloor, error) {
	res, worker, err := idleFloorRun(ctx, o, fleet, items, capacity, logw)
	if err != nil {
		return nil, err
	}
	sum := bench.Summarize(res, o.SLO)
	if sum.OK == 0 {
		return nil, fmt.Errorf("idle floor: none of %d requests succeeded alone on copies of %s", len(res), worker)
	}
	return &idleFloor{worker: worker, p50: sum.TTFT.P50, p99: sum.TTFT.P99}, nil
}

// idleFloorRun replays items at idleFloorLoad % of capacity under
// least-connections on len(fleet) copies of its fastest worker (highest
// speed, then most KV tokens, then first listed), and names the worker
// copied. The simulated card's collision factor is never below 1, so a
// request's time to first token there is the least any router could
// give it on that fleet (with no more of its prompt cached than it finds
// then).
func idleFloorRun(ctx context.Context, o Options, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) ([]bench.Result, string, error) {
	if len(fleet) == 0 {
		return nil, "", errors.New("idle floor: no simulated workers")
	}
	best := fleet[0]
	for _, w := range fleet[1:] {
		if w.Params.Speed > best.Params.Speed || w.Params.Speed == best.Params.Speed && w.Params.KVTokens > best.Params.KVTokens {
			best = w
		}
	}
	ideal := make([]sim.WorkerSpec, len(fleet))
	for i := range ideal {
		p := best.Params
		p.Seed = int64(i + 1)
		ideal[i] = sim.WorkerSpec{Name: fmt.Sprintf("floor-%d", i), Params: p}
	}
	it, err := vsim.AtRate(items, idleFloorLoad/100.0*capacity)
	if err != nil {
		return nil, "", fmt.Errorf("idle floor: %w", err)
	}
	r, err := runPolicy(ctx, o, ideal, scheduler.PolicyLeastConnections, 1, false, it, logw)
	if err != nil {
		return nil, "", fmt.Errorf("idle floor: %w", err)
	}
	return r.res, best.Name, nil
}

// writeBalance says, for a virtual run, how often each row herded: at how
// many telemetry scrapes a worker held two or more requests and over 1.5×
// the fleet's mean while another sat idle (vsim.Balance), the failure
// prefix affinity must not cause.
func writeBalance(md *bytes.Buffer, runs []bench.NamedRun, balance map[string]*vsim.Balance) {
	var parts []string
	for _, r := range runs {
		b := balance[r.Name]
		if b == nil || b.Scrapes == 0 {
			return
		}
		parts = append(parts, fmt.Sprintf("%s %.1f%% (%d of %d)", r.Name, 100*float64(b.Herded)/float64(b.Scrapes), b.Herded, b.Scrapes))
	}
	fmt.Fprintf(md, "Herding, scrapes with a worker over 1.5× the mean load while another idled: %s.\n\n", strings.Join(parts, ", "))
}
