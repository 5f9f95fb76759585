package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
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

// builtinTrace is the load of --trace auto: the first 2,000 rows of the
// Azure LLM inference trace (conversation, 2023; CC BY 4.0, see
// testdata/README.md), built into the binary so a clean clone and an
// installed binary replay the same requests.
//
//go:embed testdata/azure_conv_2000.csv
var builtinTrace []byte

// builtinTraceName says which load --trace auto is, in output and reports.
const builtinTraceName = "built-in trace: first 2,000 rows of the Azure LLM inference trace 2023, conversation (CC BY 4.0)"

// compareOpts are the flags of `sluice bench compare`.
type compareOpts struct {
	virtual        bool
	trace          string
	limit          int
	offset         int
	seed           uint64
	loads          []float64
	burst          bool
	burstAt        time.Duration
	burstFor       time.Duration
	burstFactor    float64
	policies       []scheduler.Policy
	timeScale      float64
	maxConcurrency int
	fleetFile      string
	out            string
	timeout        time.Duration
	// replicas, above 1, adds the row "sluice ×N": N routers sharing the
	// fleet through Redis (redis, or a private redis-server when empty)
	// behind a round-robin front, next to the one-router row.
	replicas int
	redis    string
	// router, when set, supplies weights, admission, telemetry and stats
	// settings (and max_concurrency) instead of the defaults.
	router *config.Config
	// slo is the objective every run is judged by (bench.DefaultSLO).
	slo bench.SLO
	// goodput scans loads in steps of 5% for the highest one each policy
	// serves within the SLO (virtual time only).
	goodput bool
	// idleFloor replays the rows alone on copies of the fleet's fastest
	// worker (virtual time only): the least time to first token any
	// router could give them, which each load's p99 goal is judged
	// against.
	idleFloor bool
	// workers, when set, are running engines (kind llamacpp) to compare
	// on instead of a sim fleet, on the wall clock.
	workers []config.Worker
	// capacity, above 0, is the fleet's capacity in req/s that --loads
	// are percentages of, instead of vsim.Capacity's estimate of the sim
	// fleet; required with workers.
	capacity float64
	// kvEvents adds the row "sluice + KV events": Sluice with the exact
	// index of the engines' KV-cache events (over real HTTP the sim
	// fleet publishes them over ZeroMQ and the router reads prompts'
	// token ids from its /tokenize), and a table of what each row's
	// router expected cached against what the engines found.
	kvEvents bool
}

// scenario is one load of a comparison: the same items for every policy.
type scenario struct {
	name  string // directory name, e.g. "load-80"
	title string
	items []bench.Item
	rate  float64 // mean arrival rate, req/s
}

// benchCompare runs Sluice and the baseline policies against the same
// simulated fleet with the same trace rows and seed, at several loads and
// in a burst, and writes one report per load plus a summary.
func benchCompare(args []string) error {
	fs := flag.NewFlagSet("sluice bench compare", flag.ContinueOnError)
	var o compareOpts
	var loads, policies string
	fs.BoolVar(&o.virtual, "virtual", false, "simulate in virtual time (internal/vsim) instead of real HTTP; fast")
	fs.StringVar(&o.trace, "trace", "auto", "trace file; \"auto\" uses the built-in trace (first 2,000 rows of the Azure LLM inference trace), \"synthetic\" a generated load, \"synthetic-code\" long prompts with short answers, \"synthetic-chat\" generated multi-turn conversations")
	fs.IntVar(&o.limit, "limit", 2000, "trace rows (or synthetic requests) per load")
	fs.IntVar(&o.offset, "offset", 0, "skip this many trace rows")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of synthetic loads and of the random baselines")
	fs.StringVar(&loads, "loads", "50,80,95", "loads as percentages of the estimated fleet capacity")
	fs.BoolVar(&o.burst, "burst", true, "also run a burst: 50% load with a spike of --burst-factor for --burst-for")
	fs.DurationVar(&o.burstAt, "burst-at", 120*time.Second, "when the burst starts (model time)")
	fs.DurationVar(&o.burstFor, "burst-for", 30*time.Second, "how long the burst lasts (model time)")
	fs.Float64Var(&o.burstFactor, "burst-factor", 5, "arrival rate multiplier during the burst (5 × 50% = 250% of capacity)")
	fs.StringVar(&policies, "policies", joinPolicies(scheduler.Policies), "comma-separated policies to compare")
	fs.Float64Var(&o.timeScale, "time-scale", 10, "real HTTP only: model seconds per wall second of the sim fleet")
	fs.IntVar(&o.maxConcurrency, "max-concurrency", 0, "Sluice's max_concurrency per worker; 0 takes each worker's slot count (baselines ignore it)")
	fs.StringVar(&o.fleetFile, "fleet", "", "fleet file (sluice sim --fleet format); default the demo fleet")
	fs.StringVar(&o.out, "out", "bench-compare", "output directory")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "real HTTP only: per-request timeout (model time)")
	fs.IntVar(&o.replicas, "replicas", 1, "real HTTP only: above 1, also run Sluice as this many replicas sharing the fleet through Redis (ledger and stats store) behind a round-robin front: the row \"sluice ×N\"")
	fs.StringVar(&o.redis, "redis", "", "with --replicas: the redis:// URL the replicas share (keys under a prefix of the run's own, deleted at the end); empty starts a private redis-server from PATH")
	o.slo = bench.DefaultSLO
	fs.DurationVar(&o.slo.TTFT, "slo-ttft", o.slo.TTFT, "SLO: time to first token, before the allowance for the prompt")
	fs.DurationVar(&o.slo.TTFTPer1kPrompt, "slo-ttft-per-1k", o.slo.TTFTPer1kPrompt, "SLO: time to first token allowed per 1,000 prompt tokens")
	fs.Float64Var(&o.slo.MinDecodeTokS, "slo-min-decode", o.slo.MinDecodeTokS, "SLO: per-stream decode floor in tokens/s")
	fs.BoolVar(&o.goodput, "goodput", false, "virtual only: also find each policy's goodput, the highest load (steps of 5% of capacity, up to 150%) at which at least 95% of requests meet the SLO")
	fs.BoolVar(&o.idleFloor, "idle-floor", false, "virtual only: also replay the rows alone on copies of the fleet's fastest worker (1% load), the least time to first token any router could give them, and say at each load whether the p99 TTFT goal is within its reach")
	workers := fs.String("workers", "", "real HTTP only: compare on these running workers instead of a sim fleet: comma-separated [NAME=]URL, kind llamacpp, models discovered; on the wall clock (time scale 1); needs --capacity")
	fs.Float64Var(&o.capacity, "capacity", 0, "the fleet's capacity in req/s that --loads are percentages of; required with --workers (measure it, see docs/benchmarks.md); 0 with a sim fleet estimates it")
	fs.BoolVar(&o.kvEvents, "kv-events", false, "also run Sluice with the exact index of the simulated workers' KV-cache events (row \""+kvRow+"\"; over real HTTP published over ZeroMQ, with token ids from the workers' /tokenize, as vLLM's), and compare each row's expected cached prompt tokens with the engines' own accounting")
	routerFile := fs.String("config", "", "router config (sluice serve format) whose weights, admission, telemetry and stats settings to use; its workers and policy are ignored")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *routerFile != "" {
		rc, err := config.Load(*routerFile)
		if err != nil {
			return err
		}
		o.router = &rc
		if o.maxConcurrency == 0 && len(rc.Workers) > 0 {
			o.maxConcurrency = int(rc.Workers[0].MaxConcurrency)
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if *workers != "" {
		if o.workers, err = parseWorkers(*workers); err != nil {
			return err
		}
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "time-scale" || f.Name == "fleet" {
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return fmt.Errorf("%s: not with --workers, which run on the wall clock as they are", strings.Join(set, " and "))
		}
		o.timeScale = 1
	}
	if o.loads, err = parseLoads(loads); err != nil {
		return err
	}
	if o.policies, err = parsePolicies(policies); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return runCompare(ctx, o, os.Stderr)
}

// parseWorkers reads --workers: comma-separated [NAME=]URL, each a
// llama.cpp worker; a worker without a name is named by its host:port.
func parseWorkers(s string) ([]config.Worker, error) {
	var out []config.Worker
	seen := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, raw, named := strings.Cut(f, "=")
		if !named {
			raw = f
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--workers: %q is not [NAME=]http(s)://HOST:PORT", f)
		}
		if !named {
			name = u.Host
		}
		if name == "" || seen[name] {
			return nil, fmt.Errorf("--workers: worker name %q is empty or given twice", name)
		}
		seen[name] = true
		out = append(out, config.Worker{Name: name, URL: strings.TrimSuffix(raw, "/"), Kind: "llamacpp"})
	}
	if len(out) == 0 {
		return nil, errors.New("--workers: none given")
	}
	return out, nil
}

// checkWorkers rejects what --workers cannot do: run in virtual time, or
// guess the capacity of engines it cannot model.
func checkWorkers(o compareOpts) error {
	switch {
	case len(o.workers) == 0:
		return nil
	case o.virtual:
		return errors.New("--workers is real HTTP only: virtual time simulates a sim fleet, not running engines")
	case o.capacity <= 0:
		return errors.New("--workers needs --capacity REQ_PER_S: the loads are percentages of the fleet's capacity, which only a measurement of real engines can give (see docs/benchmarks.md)")
	}
	return nil
}

// checkReplicas rejects --replicas and --redis where they cannot apply.
func checkReplicas(o compareOpts) error {
	switch {
	case o.replicas < 0:
		return fmt.Errorf("--replicas %d: want 1 (one router) or more", o.replicas)
	case o.replicas > 1 && o.virtual:
		return errors.New("--replicas is real HTTP only: replicas share state through Redis, which virtual time does not simulate")
	case o.replicas <= 1 && o.redis != "":
		return errors.New("--redis is for --replicas above 1")
	}
	return nil
}

func joinPolicies(ps []scheduler.Policy) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ",")
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(f, "%"), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("--loads: %q is not a positive percentage", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func parsePolicies(s string) ([]scheduler.Policy, error) {
	var out []scheduler.Policy
	for f := range strings.SplitSeq(s, ",") {
		p := scheduler.Policy(strings.TrimSpace(f))
		if p == "" {
			continue
		}
		if !slices.Contains(scheduler.Policies, p) {
			return nil, fmt.Errorf("--policies: unknown policy %q (want %s)", p, joinPolicies(scheduler.Policies))
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("--policies: %q given twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("--policies: none given")
	}
	return out, nil
}

// baseItems reads the trace (or synthesises a load) that every scenario
// rescales; it also says where the load came from.
func baseItems(o compareOpts) ([]bench.Item, string, error) {
	path := o.trace
	if path == "auto" {
		items, err := bench.ParseTrace(bytes.NewReader(builtinTrace), "azure_conv_2000.csv", bench.TraceOptions{Offset: o.offset, Limit: o.limit, Seed: o.seed})
		desc := fmt.Sprintf("%s, rows %d..%d", builtinTraceName, o.offset+1, o.offset+len(items))
		fmt.Fprintf(os.Stderr, "load: %s (--trace FILE for another)\n", desc)
		return items, desc, err
	}
	if path == "synthetic" {
		items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: o.limit, Seed: o.seed})
		return items, fmt.Sprintf("synthetic Poisson, %d requests, default lengths, seed %d", o.limit, o.seed), err
	}
	if path == "synthetic-code" {
		items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: o.limit, Seed: o.seed, Prompt: bench.CodePromptLengths, Output: bench.CodeOutputLengths})
		return items, fmt.Sprintf("synthetic code completion (Poisson; prompts median 1,500 tokens, mean ~2,000; answers median 13, mean ~27), %d requests, seed %d", o.limit, o.seed), err
	}
	if path == "synthetic-chat" {
		items, err := bench.SynthesizeChat(bench.Chat{Arrivals: bench.Arrivals{Rate: 1}, Count: o.limit, Seed: o.seed})
		return items, fmt.Sprintf("synthetic multi-turn chat (bench.Chat defaults: mean 4 turns, 30 s think time, 4 shared 1,000-token system prompts, 128-token blocks), %d requests, seed %d", o.limit, o.seed), err
	}
	// Traces of lengths only (ShareGPT, arXiv) get Poisson arrivals; each
	// scenario rescales them to its load.
	items, err := vsim.ReadLoad(path, bench.TraceOptions{Offset: o.offset, Limit: o.limit, Seed: o.seed, Arrivals: bench.Arrivals{Rate: 1}})
	return items, fmt.Sprintf("%s, rows %d..%d", path, o.offset+1, o.offset+len(items)), err
}

// scenarios builds the loads from the base items and the fleet capacity.
func scenarios(o compareOpts, items []bench.Item, capacity float64) ([]scenario, error) {
	var out []scenario
	for _, l := range o.loads {
		rate := l / 100 * capacity
		it, err := vsim.AtRate(items, rate)
		if err != nil {
			return nil, err
		}
		out = append(out, scenario{name: fmt.Sprintf("load-%g", l), title: fmt.Sprintf("%g%% of capacity (%.2f req/s)", l, rate), items: it, rate: rate})
	}
	if o.burst {
		rate := 0.5 * capacity
		it, err := vsim.AtRate(items, rate)
		if err != nil {
			return nil, err
		}
		it = vsim.Burst(it, o.burstAt, o.burstFor, o.burstFactor)
		out = append(out, scenario{name: "burst", rate: rate, items: it,
			title: fmt.Sprintf("burst: 50%% of capacity (%.2f req/s), ×%g for %v from %v (%.0f%% of capacity)", rate, o.burstFactor, o.burstFor, o.burstAt, 50*o.burstFactor)})
	}
	return out, nil
}

// runCompare runs every scenario under every policy and writes the
// reports; progress goes to logw.
func runCompare(ctx context.Context, o compareOpts, logw *os.File) error {
	if err := checkReplicas(o); err != nil {
		return err
	}
	if err := checkWorkers(o); err != nil {
		return err
	}
	switch {
	case o.kvEvents && len(o.workers) > 0:
		return errors.New("--kv-events is for a sim fleet, which publishes its KV-cache events to the router; running workers publish theirs where their own config says (workers[].kv_events in sluice serve)")
	case o.kvEvents && o.replicas > 1:
		return errors.New("--kv-events runs one router against the sim fleet: not with --replicas")
	}
	fleet := sim.DemoFleet()
	fleetName := "sim.DemoFleet() (gpu-0, gpu-1 reference A100; gpu-2-slow speed 0.6; gpu-3-small-kv 8,192 KV tokens)"
	if len(o.workers) > 0 {
		fleet = nil
		var ws []string
		for _, w := range o.workers {
			ws = append(ws, fmt.Sprintf("%s %s (%s)", w.Name, w.URL, w.Kind))
		}
		fleetName = "running workers " + strings.Join(ws, ", ")
	} else if o.fleetFile != "" {
		var err error
		if fleet, err = sim.ParseFleetFile(o.fleetFile); err != nil {
			return err
		}
		fleetName = o.fleetFile
	}
	items, load, err := baseItems(o)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return errors.New("the load is empty")
	}
	capacity := o.capacity
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
	if o.idleFloor {
		if !o.virtual {
			return errors.New("--idle-floor is virtual only: it replays the rows on a fleet of copies of the fastest simulated worker")
		}
		fmt.Fprintf(logw, "idle floor: %d requests alone on copies of the fastest worker\n", len(items))
		if floor, err = measureIdleFloor(ctx, o, fleet, items, capacity, logw); err != nil {
			return err
		}
	}
	redisDesc := ""
	if o.replicas > 1 {
		if o.redis == "" {
			r, err := startPrivateRedis(ctx)
			if err != nil {
				return err
			}
			defer r.Stop()
			o.redis = r.URL()
			redisDesc = "a private redis-server on " + r.addr + ", started for the run"
			fmt.Fprintf(logw, "redis: started a private redis-server on %s for the %d replicas; it stops at the end (--redis URL to use another)\n", r.addr, o.replicas)
		} else {
			redisDesc = redisconn.Redact(o.redis)
			fmt.Fprintf(logw, "redis: the %d replicas share %s (keys under a prefix of each run's own, deleted at its end)\n", o.replicas, redisDesc)
		}
	}
	mode := fmt.Sprintf("real HTTP on loopback (sim fleet at time scale %g; times converted back to model time)", o.timeScale)
	switch {
	case o.virtual:
		mode = "virtual time (internal/vsim)"
	case len(o.workers) > 0:
		mode = "real HTTP against running workers (wall-clock time: time scale 1)"
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Sluice policy comparison\n\n")
	fmt.Fprintf(&md, "- Mode: %s\n- Fleet: %s\n- Load: %s\n- Seed: %d\n", mode, fleetName, load, o.seed)
	fmt.Fprintf(&md, "- "+capacityLine+"\n", capacity)
	mc := "auto (learned below each worker's slot count)"
	switch {
	case o.router != nil && !o.router.Limits.Adaptive && o.maxConcurrency > 0:
		mc = strconv.Itoa(o.maxConcurrency) + ", fixed"
	case o.router != nil && !o.router.Limits.Adaptive:
		mc = "each worker's slot count, fixed"
	case o.maxConcurrency > 0:
		mc = "learned below a cap of " + strconv.Itoa(o.maxConcurrency)
	}
	admission := "max_queue 256, queue_timeout 30s, default weights (config defaults)"
	if o.router != nil {
		admission = fmt.Sprintf("max_queue %d, queue_timeout %v, weights %+v (from --config)", o.router.Admission.MaxQueue, o.router.Admission.QueueTimeout, o.router.Weights)
		if !o.router.Admission.KVFit {
			admission += ", admission.kv_fit off"
		}
	}
	fmt.Fprintf(&md, "- Sluice max_concurrency: %s; baselines ignore it. Router: %s.\n", mc, admission)
	if floor != nil {
		fmt.Fprintf(&md, "- Idle floor (--idle-floor): the same rows alone on %d copies of %s at 1%% of capacity give TTFT p50 %.1f ms, p99 %.1f ms: no router gives these requests an earlier first token.\n",
			len(fleet), floor.worker, floor.p50, floor.p99)
	}
	if o.replicas > 1 {
		fmt.Fprintf(&md, "- Row \"%s\": %d Sluice routers in this process sharing the fleet through %s — the reservation ledger (shared.redis) and the stats store (stats.store) — behind a round-robin HTTP front on loopback (request i to replica i mod %d); the other rows are one router each, without the front.\n",
			replicasRow(o.replicas), o.replicas, redisDesc, o.replicas)
	}
	fmt.Fprintln(&md)

	for _, sc := range scens {
		var runs []bench.NamedRun
		var limits []scheduler.WorkerState
		var one, many *vsim.HTTPStats
		expected := map[string]int64{}
		for _, p := range o.policies {
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, p, len(sc.items))
			var res []bench.Result
			var ws []scheduler.WorkerState
			var hs vsim.HTTPStats
			var err error
			if o.kvEvents && o.virtual { // the same virtual run, with its expectations
				var st vsim.Stats
				res, st, err = runVirtual(o, fleet, p, false, sc.items)
				ws, expected[string(p)] = st.Workers, st.ExpectedCached
			} else {
				res, ws, hs, err = runPolicy(ctx, o, fleet, p, 1, false, sc.items, logw)
				expected[string(p)] = hs.ExpectedCached
			}
			if err != nil {
				return fmt.Errorf("%s, policy %s: %w", sc.name, p, err)
			}
			if p == scheduler.PolicySluice {
				limits, one = ws, &hs
			}
			runs = append(runs, bench.NamedRun{Name: string(p), Results: res, SLO: o.slo})
		}
		if o.replicas > 1 {
			name := replicasRow(o.replicas)
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, name, len(sc.items))
			res, _, hs, err := runPolicy(ctx, o, fleet, scheduler.PolicySluice, o.replicas, false, sc.items, logw)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", sc.name, name, err)
			}
			many = &hs
			runs = append(runs, bench.NamedRun{Name: name, Results: res, SLO: o.slo})
		}
		var kvHTTP *vsim.HTTPStats
		if o.kvEvents {
			fmt.Fprintf(logw, "%s: %s (%d requests)\n", sc.name, kvRow, len(sc.items))
			var res []bench.Result
			var err error
			if o.virtual {
				var st vsim.Stats
				res, st, err = runVirtual(o, fleet, scheduler.PolicySluice, true, sc.items)
				expected[kvRow] = st.ExpectedCached
			} else {
				var hs vsim.HTTPStats
				res, _, hs, err = runPolicy(ctx, o, fleet, scheduler.PolicySluice, 1, true, sc.items, logw)
				expected[kvRow], kvHTTP = hs.ExpectedCached, &hs
			}
			if err != nil {
				return fmt.Errorf("%s, %s: %w", sc.name, kvRow, err)
			}
			runs = append(runs, bench.NamedRun{Name: kvRow, Results: res, SLO: o.slo})
		}
		dir := filepath.Join(o.out, sc.name)
		if _, err := bench.WriteReport(dir, runs); err != nil {
			return err
		}
		for _, r := range runs {
			if err := writeFile(filepath.Join(dir, csvName(r.Name)), func(f *os.File) error { return bench.WriteCSV(f, r.Results) }); err != nil {
				return err
			}
		}
		fmt.Fprintf(&md, "## %s\n\nReport: [%s/%s](%s/%s)\n\n```\n", sc.title, sc.name, bench.ReportFile, sc.name, bench.ReportFile)
		if err := bench.WriteCompareTable(&md, runs); err != nil {
			return err
		}
		fmt.Fprintf(&md, "```\n\n")
		writeGoals(&md, sc, runs, o.virtual, o.timeScale, floor)
		writeReplicas(&md, runs, one, many)
		if o.kvEvents {
			writeExpectedCached(&md, runs, expected, o.virtual)
			writeKVState(&md, kvHTTP, len(sc.items))
		}
		writeLimits(&md, limits)
	}
	if o.goodput {
		if err := writeGoodput(ctx, &md, o, fleet, items, capacity, logw); err != nil {
			return err
		}
	}
	path := filepath.Join(o.out, "summary.md")
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
func goodput(ctx context.Context, o compareOpts, fleet []sim.WorkerSpec, p scheduler.Policy, items []bench.Item, capacity float64, logw *os.File) (float64, float64, error) {
	best, at := 0.0, 0.0
	for l := goodputStep; l <= goodputMax; l += goodputStep {
		it, err := vsim.AtRate(items, float64(l)/100*capacity)
		if err != nil {
			return 0, 0, err
		}
		res, _, _, err := runPolicy(ctx, o, fleet, p, 1, false, it, logw)
		if err != nil {
			return 0, 0, err
		}
		if a := bench.Summarize(res, o.slo).Attainment; a >= goodputShare {
			best, at = float64(l), a
		}
	}
	return best, at, nil
}

// writeGoodput scans every policy's goodput and writes the table.
func writeGoodput(ctx context.Context, md *bytes.Buffer, o compareOpts, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) error {
	if !o.virtual {
		return errors.New("--goodput is virtual only: it runs every load from 5% to 150% of capacity")
	}
	fmt.Fprintf(md, "## Goodput\n\nThe highest load, in steps of %d%% of the estimated capacity up to %d%%, at which at least %.0f%% of requests meet the SLO (%s; refused and failed requests miss it):\n\n| policy | goodput (%% of capacity) | req/s | attainment there |\n| --- | ---: | ---: | ---: |\n",
		goodputStep, goodputMax, 100*goodputShare, o.slo)
	for _, p := range o.policies {
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

// runPolicy runs one scenario under one policy, with a fresh fleet, and
// over real HTTP through that many router replicas; with kv, the sim
// fleet publishes its KV-cache events to the router (real HTTP only).
func runPolicy(ctx context.Context, o compareOpts, fleet []sim.WorkerSpec, p scheduler.Policy, replicas int, kv bool, items []bench.Item, logw *os.File) ([]bench.Result, []scheduler.WorkerState, vsim.HTTPStats, error) {
	cfg := vsim.DefaultConfig(fleet)
	if o.router != nil {
		cfg = vsim.FromRouterConfig(*o.router, fleet)
	}
	cfg.Policy, cfg.Seed, cfg.MaxConcurrency = p, o.seed, o.maxConcurrency
	if o.virtual {
		res, st, err := vsim.RunStats(cfg, items)
		return res, st.Workers, vsim.HTTPStats{}, err
	}
	hc := vsim.HTTPConfig{Router: cfg, TimeScale: o.timeScale, Timeout: o.timeout, External: o.workers, KVEvents: kv,
		Progress: bench.ProgressBar(logw, term.IsTerminal(int(logw.Fd())))}
	if replicas > 1 {
		hc.Replicas, hc.Redis = replicas, o.redis
	}
	res, hs, err := vsim.RunHTTPStats(ctx, hc, items)
	// The first router's limits at the end, as the virtual run reports
	// them: what held requests in its queue, against real workers too.
	return res, hs.Workers, hs, err
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

// benchPlan finds the smallest fleet that meets a p99 TTFT goal on a load,
// in virtual time.
func benchPlan(args []string) error {
	fs := flag.NewFlagSet("sluice bench plan", flag.ContinueOnError)
	var (
		trace     = fs.String("trace", "auto", "trace file or decision log; \"auto\" uses the built-in trace (first 2,000 rows of the Azure LLM inference trace), \"synthetic\" a generated load")
		limit     = fs.Int("limit", 0, "trace rows (0 = all; synthetic: 2000)")
		offset    = fs.Int("offset", 0, "skip this many trace rows")
		rate      = fs.Float64("rate", 0, "rescale arrivals to this mean rate in req/s (0 = as recorded)")
		speeds    = fs.String("card-speeds", "1", "comma-separated card speeds, cycled over the workers (1 = A100, 2 ≈ H100)")
		target    = fs.Duration("target-p99-ttft", 2*time.Second, "the goal: p99 time to first token, with no request refused")
		maxW      = fs.Int("max-workers", 1000, "largest fleet to try")
		seed      = fs.Uint64("seed", 1, "seed of synthetic loads")
		policy    = fs.String("policy", string(scheduler.PolicySluice), "routing policy")
		maxConcur = fs.Int("max-concurrency", 0, "Sluice's max_concurrency per worker; 0 = slot count")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var sp []float64
	for f := range strings.SplitSeq(*speeds, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return fmt.Errorf("--card-speeds: %q is not a positive number", f)
		}
		sp = append(sp, v)
	}
	n := *limit
	if n == 0 && *trace == "synthetic" {
		n = 2000
	}
	items, load, err := baseItems(compareOpts{trace: *trace, limit: n, offset: *offset, seed: *seed})
	if err != nil {
		return err
	}
	if *rate > 0 {
		if items, err = vsim.AtRate(items, *rate); err != nil {
			return err
		}
	}
	cfg := vsim.DefaultConfig(nil)
	cfg.Policy, cfg.MaxConcurrency, cfg.Seed = scheduler.Policy(*policy), *maxConcur, *seed
	res, err := vsim.Plan(vsim.PlanConfig{Router: cfg, Card: sim.DefaultParams(), Speeds: sp, Items: items, TargetP99TTFT: *target, MaxWorkers: *maxW})
	if err != nil {
		return err
	}
	fmt.Printf("load: %s (%d requests)\ngoal: p99 TTFT ≤ %v, nothing refused; cards: speeds %s cycled\n\n", load, len(items), *target, *speeds)
	fmt.Printf("%8s  %10s  %10s  %8s  %s\n", "workers", "p50 TTFT", "p99 TTFT", "errors", "goal")
	for _, s := range res.Steps {
		fmt.Printf("%8d  %8.0fms  %8.0fms  %8d  %v\n", s.Workers, s.Summary.TTFT.P50, s.Summary.TTFT.P99, s.Summary.Errors, s.Met)
	}
	if res.Workers == 0 {
		return fmt.Errorf("no fleet of up to %d workers meets the goal", *maxW)
	}
	fmt.Printf("\nsmallest fleet meeting the goal: %d workers\n", res.Workers)
	return nil
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
func measureIdleFloor(ctx context.Context, o compareOpts, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) (*idleFloor, error) {
	res, worker, err := idleFloorRun(ctx, o, fleet, items, capacity, logw)
	if err != nil {
		return nil, err
	}
	sum := bench.Summarize(res, o.slo)
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
func idleFloorRun(ctx context.Context, o compareOpts, fleet []sim.WorkerSpec, items []bench.Item, capacity float64, logw *os.File) ([]bench.Result, string, error) {
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
	res, _, _, err := runPolicy(ctx, o, ideal, scheduler.PolicyLeastConnections, 1, false, it, logw)
	if err != nil {
		return nil, "", fmt.Errorf("idle floor: %w", err)
	}
	return res, best.Name, nil
}
