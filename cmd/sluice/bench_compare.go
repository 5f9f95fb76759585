package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/compare"
	"github.com/sluice-router/sluice/internal/config"
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

// benchCompare runs Sluice and the baseline policies against the same
// simulated fleet with the same trace rows and seed, at several loads and
// in a burst, and writes one report per load plus a summary.
func benchCompare(args []string) error {
	fs := flag.NewFlagSet("sluice bench compare", flag.ContinueOnError)
	o := compare.Options{BuiltinTrace: builtinTrace, BuiltinTraceName: builtinTraceName}
	var loads, policies string
	fs.BoolVar(&o.Virtual, "virtual", false, "simulate in virtual time (internal/vsim) instead of real HTTP; fast")
	fs.StringVar(&o.Trace, "trace", "auto", "trace file; \"auto\" uses the built-in trace (first 2,000 rows of the Azure LLM inference trace), \"synthetic\" a generated load, \"synthetic-code\" long prompts with short answers, \"synthetic-chat\" generated multi-turn conversations, \"synthetic-agent\" coding-agent sessions whose prompts repeat the conversation so far")
	fs.IntVar(&o.Limit, "limit", 2000, "trace rows (or synthetic requests) per load")
	fs.IntVar(&o.Offset, "offset", 0, "skip this many trace rows")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of synthetic loads and of the random baselines")
	fs.StringVar(&loads, "loads", "50,80,95", "loads as percentages of the estimated fleet capacity")
	fs.BoolVar(&o.Burst, "burst", true, "also run a burst: 50% load with a spike of --burst-factor for --burst-for")
	fs.DurationVar(&o.BurstAt, "burst-at", 120*time.Second, "when the burst starts (model time)")
	fs.DurationVar(&o.BurstFor, "burst-for", 30*time.Second, "how long the burst lasts (model time)")
	fs.Float64Var(&o.BurstFactor, "burst-factor", 5, "arrival rate multiplier during the burst (5 × 50% = 250% of capacity)")
	fs.StringVar(&policies, "policies", joinPolicies(scheduler.Policies), "comma-separated policies to compare")
	fs.Float64Var(&o.TimeScale, "time-scale", 10, "real HTTP only: model seconds per wall second of the sim fleet")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "Sluice's max_concurrency per worker; 0 takes each worker's slot count (baselines ignore it)")
	fs.StringVar(&o.FleetFile, "fleet", "", "fleet file (sluice sim --fleet format); default the demo fleet")
	fs.StringVar(&o.Out, "out", "bench-compare", "output directory")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "real HTTP only: per-request timeout (model time)")
	fs.IntVar(&o.Replicas, "replicas", 1, "real HTTP only: above 1, also run Sluice as this many replicas sharing the fleet through Redis (ledger and stats store) behind a round-robin front: the row \"sluice ×N\"")
	fs.StringVar(&o.Redis, "redis", "", "with --replicas: the redis:// URL the replicas share (keys under a prefix of the run's own, deleted at the end); empty starts a private redis-server from PATH")
	o.SLO = bench.DefaultSLO
	fs.DurationVar(&o.SLO.TTFT, "slo-ttft", o.SLO.TTFT, "SLO: time to first token, before the allowance for the prompt")
	fs.DurationVar(&o.SLO.TTFTPer1kPrompt, "slo-ttft-per-1k", o.SLO.TTFTPer1kPrompt, "SLO: time to first token allowed per 1,000 prompt tokens")
	fs.Float64Var(&o.SLO.MinDecodeTokS, "slo-min-decode", o.SLO.MinDecodeTokS, "SLO: per-stream decode floor in tokens/s")
	fs.BoolVar(&o.Goodput, "goodput", false, "virtual only: also find each policy's goodput, the highest load (steps of 5% of capacity, up to 150%) at which at least 95% of requests meet the SLO")
	fs.IntVar(&o.Seeds, "seeds", 1, "virtual only: above 1, also run every load for the seeds after --seed (Sluice and least-connections) and report how Sluice's ratios to least-connections' spread over all of them")
	fs.BoolVar(&o.IdleFloor, "idle-floor", false, "virtual only: also replay the rows alone on copies of the fleet's fastest worker (1% load), the least time to first token any router could give them, and say at each load whether the p99 TTFT goal is within its reach")
	workers := fs.String("workers", "", "real HTTP only: compare on these running workers instead of a sim fleet: comma-separated [NAME=]URL, kind llamacpp, models discovered; on the wall clock (time scale 1); needs --capacity")
	fs.Float64Var(&o.Capacity, "capacity", 0, "the fleet's capacity in req/s that --loads are percentages of; required with --workers (measure it, see docs/benchmarks.md); 0 with a sim fleet estimates it")
	fs.BoolVar(&o.KVEvents, "kv-events", false, "also run Sluice with the exact index of the simulated workers' KV-cache events (row \""+compare.KVRow+"\"; over real HTTP published over ZeroMQ, with token ids from the workers' /tokenize, as vLLM's), and compare each row's expected cached prompt tokens with the engines' own accounting")
	routerFile := fs.String("config", "", "router config (sluice serve format) whose weights, admission, telemetry, limits and sessions settings to use; its workers are ignored")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *routerFile != "" {
		rc, err := config.Load(*routerFile)
		if err != nil {
			return err
		}
		o.Router = &rc
		if o.MaxConcurrency == 0 && len(rc.Workers) > 0 {
			o.MaxConcurrency = int(rc.Workers[0].MaxConcurrency)
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if *workers != "" {
		if o.Workers, err = parseWorkers(*workers); err != nil {
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
		o.TimeScale = 1
	}
	if o.Loads, err = parseLoads(loads); err != nil {
		return err
	}
	if o.Policies, err = parsePolicies(policies); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return compare.Run(ctx, o, os.Stderr)
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
	items, load, err := compare.LoadItems(compare.Options{BuiltinTrace: builtinTrace, BuiltinTraceName: builtinTraceName, Trace: *trace, Limit: n, Offset: *offset, Seed: *seed})
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
