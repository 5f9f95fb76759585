package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/sluice-router/sluice/internal/bench"
)

// runBench dispatches `sluice bench <run|compare|plan>`.
func runBench(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: sluice bench run|compare|plan [flags] (run 'sluice bench run -h')")
	}
	switch args[0] {
	case "run":
		return benchRun(args[1:])
	case "compare":
		return benchCompare(args[1:])
	case "plan":
		return benchPlan(args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(os.Stderr, "usage: sluice bench run|compare|plan [flags]")
		return flag.ErrHelp
	}
	return fmt.Errorf("unknown bench subcommand %q: want run, compare or plan", args[0])
}

// benchRun runs one open-loop benchmark and writes its table, JSON and CSV.
func benchRun(args []string) error {
	fs := flag.NewFlagSet("sluice bench run", flag.ContinueOnError)
	var (
		target      = fs.String("target", "", "base URL of the OpenAI-compatible endpoint (required)")
		trace       = fs.String("trace", "", "trace file: Azure CSV, Mooncake JSONL or a length-only CSV")
		format      = fs.String("format", "", "trace format: azure, mooncake or lengths (default: detect)")
		rate        = fs.Float64("rate", 0, "synthetic arrival rate in req/s (also the rate for length-only traces)")
		duration    = fs.Duration("duration", 0, "synthetic schedule length, and the cut-off for traces")
		count       = fs.Int("count", 0, "synthetic request count (0 = bounded by --duration)")
		burst       = fs.String("burst", "", "burstiness: gamma:CV, onoff:ON:OFF, spike:AT:FOR:K, comma-separated")
		speedup     = fs.Float64("speedup", 0, "divide trace arrival offsets by this factor")
		rateScale   = fs.Float64("rate-scale", 0, "rescale trace arrivals to this mean rate in req/s")
		offset      = fs.Int("offset", 0, "skip this many trace rows")
		limit       = fs.Int("limit", 0, "use at most this many trace rows")
		seed        = fs.Uint64("seed", 1, "seed for synthetic arrivals, lengths and trace jitter")
		model       = fs.String("model", "", "model field of each request")
		sloTTFT     = fs.Duration("slo-ttft", 0, "SLO bound on time to first token (e.g. 500ms)")
		sloTPOT     = fs.Duration("slo-tpot", 0, "SLO bound on time per output token (e.g. 50ms)")
		out         = fs.String("out", "bench-out", "directory for results.json and requests.csv")
		timeout     = fs.Duration("timeout", 5*time.Minute, "per-request timeout")
		maxInFlight = fs.Int("max-in-flight", 10000, "safety cap on outstanding requests; arrivals over it are recorded as capped")
		noStream    = fs.Bool("no-stream", false, "send non-streaming requests (TTFT then equals end-to-end)")
		report      = fs.Bool("report", false, "also write plots and report.md into --out")
		name        = fs.String("name", "run", "label of this run in the report")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *target == "" {
		return errors.New("--target is required")
	}
	arr := bench.Arrivals{Rate: *rate}
	if *burst != "" {
		var err error
		if arr, err = bench.ParseBurst(*burst, arr); err != nil {
			return err
		}
	}

	var (
		items []bench.Item
		load  string
		err   error
	)
	if *trace != "" {
		opts := bench.TraceOptions{Format: bench.Format(*format), Offset: *offset, Limit: *limit, Speedup: *speedup,
			TargetRate: *rateScale, MaxDuration: *duration, Seed: *seed, Arrivals: arr}
		items, err = bench.ReadTrace(*trace, opts)
		load = fmt.Sprintf("trace %s (format=%q offset=%d limit=%d speedup=%g rate-scale=%g max-duration=%v rate=%g burst=%q)",
			*trace, *format, *offset, *limit, *speedup, *rateScale, *duration, *rate, *burst)
	} else {
		if *rate <= 0 || (*duration <= 0 && *count <= 0) {
			return errors.New("give --trace FILE, or --rate R with --duration D or --count N")
		}
		items, err = bench.Synthesize(bench.Synthetic{Arrivals: arr, Duration: *duration, Count: *count, Seed: *seed})
		load = fmt.Sprintf("synthetic rate=%g duration=%v count=%d burst=%q", *rate, *duration, *count, *burst)
	}
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return errors.New("the load is empty")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}

	slo := bench.SLO{TTFT: *sloTTFT, TPOT: *sloTPOT}
	cfg := bench.RunConfig{Target: *target, Items: items, Model: *model, Stream: !*noStream, Timeout: *timeout,
		MaxInFlight: *maxInFlight, SLO: slo}
	meta := bench.Meta{Name: *name, Target: *target, Model: *model, Stream: cfg.Stream, Load: load, Seed: *seed,
		Items: len(items), Timeout: *timeout, MaxInFlight: *maxInFlight, Started: time.Now()}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fmt.Fprintf(os.Stderr, "sending %d requests over %v to %s\n", len(items), items[len(items)-1].At.Round(time.Millisecond), *target)
	results, runErr := bench.Run(ctx, cfg, bench.ProgressBar(os.Stderr, term.IsTerminal(int(os.Stderr.Fd()))))
	if results == nil {
		return runErr
	}
	// Write what was measured even after an interrupt.
	summary := bench.Summarize(results, slo)
	if err := bench.WriteTable(os.Stdout, summary); err != nil {
		return err
	}
	if err := bench.WriteFile(filepath.Join(*out, "results.json"), func(f *os.File) error { return bench.WriteJSON(f, meta, summary) }); err != nil {
		return err
	}
	if err := bench.WriteFile(filepath.Join(*out, "requests.csv"), func(f *os.File) error { return bench.WriteCSV(f, results) }); err != nil {
		return err
	}
	if *report {
		if _, err := bench.WriteReport(*out, []bench.NamedRun{{Name: *name, Results: results, SLO: slo}}); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", strings.Join([]string{filepath.Join(*out, "results.json"), filepath.Join(*out, "requests.csv")}, ", "))
	return runErr
}
