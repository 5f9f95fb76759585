package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/sluice-router/sluice/internal/sim"
)

// runSim runs simulated llama-server workers until SIGINT or SIGTERM:
//
//	sluice sim --listen 127.0.0.1:8081 [--model M --slots N --kv-tokens N --speed F --startup-delay D --time-scale F --seed N]
//	sluice sim --fleet fleet.yaml [--host 127.0.0.1 --first-port 8081]
//	sluice sim --demo-fleet [--first-port 8081]
func runSim(args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	def := sim.DefaultParams()
	listen := fs.String("listen", "127.0.0.1:8081", "address of the single worker")
	fleetFile := fs.String("fleet", "", "run the workers described in this YAML or JSON `file` instead of one")
	demo := fs.Bool("demo-fleet", false, "run the built-in heterogeneous 4-worker demo fleet")
	host := fs.String("host", "127.0.0.1", "host the fleet's workers listen on")
	firstPort := fs.Int("first-port", 8081, "port of the fleet's first worker; the others follow (0: pick free ports)")
	model := fs.String("model", def.Model, "model name the worker serves")
	slots := fs.Int("slots", def.Slots, "parallel slots (llama-server --parallel)")
	kv := fs.Int("kv-tokens", def.KVTokens, "KV-cache capacity in tokens")
	speed := fs.Float64("speed", def.Speed, "card speed relative to the reference A100 40GB (H100 about 2)")
	startup := fs.Duration("startup-delay", def.StartupDelay, "model loading time, in model time")
	scale := fs.Float64("time-scale", 1, "model seconds per real second (10 = ten times faster); overrides a fleet file's")
	seed := fs.Int64("seed", def.Seed, "random seed for output lengths and interference")
	verbose := fs.Bool("v", false, "log every cancelled request")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sluice sim [--listen ADDR | --fleet FILE | --demo-fleet] [flags]\n\nSimulated llama-server workers for tests, demos and benchmarks.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *fleetFile != "" && *demo {
		return errors.New("--fleet and --demo-fleet are exclusive")
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var specs []sim.WorkerSpec
	var err error
	switch {
	case *fleetFile != "":
		if specs, err = sim.ParseFleetFile(*fleetFile); err != nil {
			return err
		}
	case *demo:
		specs = sim.DemoFleet()
	default:
		p := def
		p.Model, p.Slots, p.KVTokens, p.Speed, p.StartupDelay, p.Seed = *model, *slots, *kv, *speed, *startup, *seed
		if err := p.Validate(); err != nil {
			return fmt.Errorf("invalid flags: %w", err)
		}
		h, port, err := net.SplitHostPort(*listen)
		if err != nil {
			return fmt.Errorf("--listen %q: %w", *listen, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("--listen %q: bad port", *listen)
		}
		*host, *firstPort = h, n
		specs = []sim.WorkerSpec{{Name: "sim", Params: p}}
	}
	for i := range specs {
		if set["time-scale"] || specs[i].TimeScale == 0 {
			specs[i].TimeScale = *scale
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fleet, err := sim.StartFleet(ctx, specs, *host, *firstPort, log)
	if err != nil {
		return err
	}
	defer fleet.Close()
	for _, w := range fleet.Workers() {
		p := w.Server.Params()
		log.Info("sim worker listening", "worker", w.Name, "url", w.URL, "model", p.Model,
			"slots", p.Slots, "kv_tokens", p.KVTokens, "speed", p.Speed, "startup_delay", p.StartupDelay,
			"dcgm", w.URL+"/dcgm/metrics")
	}
	<-ctx.Done()
	log.Info("sim stopping")
	return nil
}
