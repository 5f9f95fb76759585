package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// runDemo starts the heterogeneous simulated fleet and a router in front
// of it, prints where to look, and drives load (unless --load=false),
// until Ctrl-C.
func runDemo(args []string) error { return demo(args, os.Stderr) }

// demo is runDemo printing its banner to banner.
func demo(args []string, banner io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "router address")
	firstPort := fs.Int("first-port", 0, "port of the first simulated worker, the others follow (0: pick free ports)")
	load := fs.Bool("load", true, "drive a mix of short and long requests that rises through the fleet's capacity and back every 4 simulated minutes, so requests wait in Sluice's queue (--load=false: no traffic)")
	rate := fs.Float64("rate", 0, "a steady rate of requests per second for the load instead of the rise and fall (0: rise and fall)")
	scale := fs.Float64("time-scale", 1, "simulated seconds per real second (10 = ten times faster)")
	duration := fs.Duration("duration", 0, "stop by itself after this long (0: run until Ctrl-C)")
	state := fs.String("state", filepath.Join(os.TempDir(), "sluice-demo"), "directory for the demo's stats store and decision log")
	logFormat := fs.String("log-format", "text", "text or json")
	logLevel := fs.String("log-level", "info", "debug (also a line per decision), info (a traffic line every 10 s, and changes), warn or error")
	quiet := fs.Bool("quiet", false, "log warnings only (same as --log-level warn)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate < 0 || *scale <= 0 {
		return fmt.Errorf("--rate must be positive (or 0 for the default) and --time-scale positive")
	}
	level, err := parseLevel(*logLevel)
	if err != nil {
		return err
	}
	if *quiet {
		level = slog.LevelWarn
	}
	log := newLogger(*logFormat, level)

	// Bind first: with the port taken the demo fails at once, before it
	// starts a fleet or prints URLs that point at another server.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()

	ctx, stop := signalContext()
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	specs := sim.DemoFleet()
	for i := range specs {
		specs[i].TimeScale = *scale
	}
	// The load's rate at each moment since it started, in real time: the
	// cycle runs in simulated time, as the simulated cards do.
	capacity := vsim.Capacity(specs, demoMix()) * *scale
	rateAt := func(elapsed time.Duration) float64 {
		return capacity * demoShare(time.Duration(float64(elapsed)**scale))
	}
	if *rate > 0 {
		rateAt = func(time.Duration) float64 { return *rate }
	}
	// The fleet outlives the router's shutdown so requests in flight can
	// finish; the deferred Close stops it after the router is done.
	fleet, err := sim.StartFleet(context.WithoutCancel(ctx), specs, "127.0.0.1", *firstPort, nil)
	if err != nil {
		return err
	}
	defer fleet.Close()

	if err := os.MkdirAll(*state, 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.LogFormat = *listen, *logFormat
	cfg.Stats.Store = filepath.Join(*state, "stats.db")
	// No load balancer waits on the demo's /readyz: it stops once the
	// requests in flight end (the load's end with Ctrl-C).
	cfg.Shutdown.DrainDelay = 0
	cfg.Decisions.File = filepath.Join(*state, "decisions.jsonl")
	model := specs[0].Params.Model
	for _, w := range fleet.Workers() {
		// max_concurrency is left to "auto": each card's limit is learned
		// from what its streams achieve, so the slower card ends up with
		// a smaller batch without being told.
		cfg.Workers = append(cfg.Workers, config.Worker{
			Name: w.Name, URL: w.URL, Kind: "llamacpp", Models: []string{model},
			GPUMetrics: w.URL + "/dcgm/metrics",
		})
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	base := localURL(ln.Addr())
	traffic := "No traffic (--load=false): send your own requests."
	switch {
	case *load && *rate > 0:
		traffic = fmt.Sprintf("Traffic: a steady %.2f requests/s.", *rate)
	case *load:
		inReal := func(d time.Duration) time.Duration { return time.Duration(float64(d) / *scale).Round(time.Second) }
		traffic = fmt.Sprintf(`Traffic rises from %.0f%% of the fleet's capacity to %.0f%% and back every %v, passing
capacity %v in: requests then wait in Sluice's queue instead of overloading a card,
and go to the first card with room (the dashboard's queue chart and decisions).`,
			demoLowShare*100, demoHighShare*100, inReal(demoCycle), inReal(demoOverCapacity()))
	}
	fmt.Fprintf(banner, `
  dashboard    %[1]s/   (open it in a browser: workers, scores, live charts, decisions)

Sluice demo: 4 simulated GPUs (one slower card, one with a small KV cache) behind the router.
%[4]s

  router       %[1]s   (OpenAI API: POST /v1/chat/completions, model %[2]q)
  workers      %[1]s/api/workers
  decisions    %[1]s/debug/decisions?limit=5
  metrics      %[1]s/metrics
  state        %[3]s (averages survive a restart)

Try:
  curl -s %[1]s/v1/chat/completions -d '{"model":%[2]q,"messages":[{"role":"user","content":"hi"}],"max_tokens":32}'

Ctrl-C stops everything.

`, base, model, *state, traffic)

	var wg sync.WaitGroup
	defer wg.Wait() // before fleet.Close: load requests end with ctx
	if *load {
		if *rate > 0 {
			log.Info("demo load: a steady Poisson stream of short and long requests", "rate_per_s", round2(*rate))
		} else {
			log.Info("demo load: short and long requests rising through the fleet's estimated capacity and back",
				"cycle", time.Duration(float64(demoCycle) / *scale), "from_per_s", round2(capacity*demoLowShare), "to_per_s", round2(capacity*demoHighShare))
		}
		wg.Go(func() { driveLoad(ctx, base, model, rateAt, log) })
	}
	return serve(ctx, cfg, ln, log, 5*time.Second, nil)
}

// localURL is the URL of the router listening on addr, as this machine
// reaches it: the port bound (--listen :0 picks one), and 127.0.0.1 for a
// listener on every address (:8080, 0.0.0.0:8080).
func localURL(addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String()
	}
	if ta.IP.IsUnspecified() {
		return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
	}
	return "http://" + ta.String()
}

// The demo's request mix: prompts of demoPromptMin up to demoPromptMin +
// demoPromptSpan tokens, uniform, and outputs of one of demoOutputs.
const (
	demoPromptMin  = 100
	demoPromptSpan = 2000
)

var demoOutputs = []int{16, 32, 64, 128, 256, 1024}

// The demo's load rises from demoLowShare of the fleet's estimated
// capacity to demoHighShare and back every demoCycle of simulated time.
// The estimate counts every slot busy; the learned limits may run fewer
// streams for a faster decode, so requests already wait in Sluice's queue
// a little under 100%. At a steady load well under capacity nothing waits
// once the limits are learnt: the queue, the one thing Sluice does that a
// load balancer does not, never shows. Rising past capacity in the first
// minutes of each cycle, and falling back under it so the queue drains, it
// shows requests held and then placed as cards free, then the fleet
// recovering. A much higher peak swamps the fleet instead: the queue grows
// for minutes and requests wait out admission.queue_timeout.
const (
	demoCycle     = 4 * time.Minute
	demoLowShare  = 0.5
	demoHighShare = 1.1
)

// demoShare is the share of the fleet's estimated capacity the demo's
// load drives at simulated time t since it started: a cosine from
// demoLowShare at the start of each cycle up to demoHighShare half-way
// through and back.
func demoShare(t time.Duration) float64 {
	phase := 2 * math.Pi * float64(t%demoCycle) / float64(demoCycle)
	return demoLowShare + (demoHighShare-demoLowShare)*(1-math.Cos(phase))/2
}

// demoOverCapacity is when, in simulated time, demoShare first reaches
// the fleet's estimated capacity.
func demoOverCapacity() time.Duration {
	phase := math.Acos(1 - 2*(1-demoLowShare)/(demoHighShare-demoLowShare))
	return time.Duration(phase / (2 * math.Pi) * float64(demoCycle))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// demoMix is the demo's request mix as items for vsim.Capacity: the mean
// prompt with each output length.
func demoMix() []bench.Item {
	items := make([]bench.Item, len(demoOutputs))
	for i, o := range demoOutputs {
		items[i] = bench.Item{PromptTokens: demoPromptMin + demoPromptSpan/2, OutputTokens: o}
	}
	return items
}

// driveLoad sends an open-loop Poisson stream of requests, mostly short
// with some long, until ctx ends: the mix that makes a naive balancer's
// tail latency explode. rate gives the requests per second at each moment
// since the first request; each gap is drawn at the rate of its start,
// which is close enough for a rate that changes over minutes.
func driveLoad(ctx context.Context, base, model string, rate func(elapsed time.Duration) float64, log *slog.Logger) {
	rng := rand.New(rand.NewPCG(1, 2))
	client := &http.Client{}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Wait for the router to listen before the first request.
	for i := 0; i < 100; i++ {
		if resp, err := client.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	start := time.Now()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(rng.ExpFloat64() / rate(time.Since(start)) * float64(time.Second))):
		}
		maxTokens := demoOutputs[rng.IntN(len(demoOutputs))]
		prompt := demoPromptMin + rng.IntN(demoPromptSpan)
		body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"ignore_eos":true,"sim_prompt_tokens":%d,"messages":[{"role":"user","content":"demo request %d"}]}`, model, maxTokens, prompt, n)
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader([]byte(body)))
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("demo load request failed", "err", err)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
}
