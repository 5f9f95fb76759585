package vsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// HTTPConfig runs a Config's scenario for real: a loopback sim fleet, the
// real router (server.New) and the HTTP load generator (bench.Run).
type HTTPConfig struct {
	// Router is the scenario, exactly as for Run. Its durations (queue
	// timeout, scrape interval, staleness) are model time and are divided
	// by TimeScale for the router, which runs on the wall clock.
	Router Config
	// TimeScale is how many model seconds pass per wall second in the sim
	// workers; 0 means 1. Arrivals are compressed by it and measured times
	// multiplied back, so results are in model time like Run's.
	TimeScale float64
	// Timeout bounds each request, in model time; 0 means none.
	Timeout time.Duration
	// Logger receives the router's and workers' logs; nil discards them.
	Logger *slog.Logger
	// Progress, if set, is bench.Run's progress callback.
	Progress func(bench.Progress)
	// Replicas, when above 1, runs that many routers in front of the one
	// fleet, sharing it as replicas in production do: the reservation
	// ledger (shared.redis) and the stats store (stats.store) on Redis,
	// and a round-robin front on loopback as their load balancer.
	Replicas int
	// Redis is the redis:// URL the replicas share; required when
	// Replicas is above 1. The run keeps its keys under a prefix of its
	// own and deletes them at the end, so runs never see each other's
	// state.
	Redis string
	// External are workers already running (real engines such as
	// llama.cpp's llama-server) to run against instead of starting
	// Router.Workers as a sim fleet; Router.Workers and TimeScale are then
	// ignored: a real engine runs on the wall clock, so model time is wall
	// time (scale 1). Each keeps its own kind, models (discovered from
	// /v1/models when empty) and max_concurrency (Router.MaxConcurrency
	// when 0); none is read for GPU metrics unless it names an exporter.
	// Requests ask for Router.Model, else the first model the router
	// discovered on the first worker.
	External []config.Worker
	// KVEvents makes every sim worker publish its prefix cache's changes
	// as vLLM's KV-cache events over ZeroMQ on loopback, and the router
	// subscribe to them (workers[].kv_events), so that its prefix term
	// reads the exact index and it asks the workers' /tokenize for
	// prompts' token ids, as against vLLM workers. The load starts once
	// the router has each worker's first batch. One router, sim fleet
	// only.
	KVEvents bool
}

// RouterConfig returns the router configuration RunHTTPStats uses for the
// scenario c against workers at urls, with its durations divided by
// scale: policy, weights, admission, telemetry interval and staleness
// and max_concurrency from c, and each worker's DCGM exporter path
// (the sim serves /dcgm/metrics) so the GPU term reads what Run's does.
func RouterConfig(c Config, urls []string, scale float64) config.Config {
	rc := config.DefaultConfig()
	rc.Listen = "127.0.0.1:0"
	rc.Shutdown.DrainDelay = 0 // no load balancer in front to drain
	rc.Policy = c.Policy
	if c.Weights != nil {
		rc.Weights = *c.Weights
	}
	sd := func(d time.Duration) time.Duration { return max(time.Duration(float64(d)/scale), time.Millisecond) }
	rc.Admission.MaxQueue, rc.Admission.QueueTimeout = c.MaxQueue, sd(c.QueueTimeout)
	if c.MaxOvertake > 0 {
		rc.Admission.MaxOvertake = sd(c.MaxOvertake)
	} else {
		rc.Admission.MaxOvertake = sd(scheduler.DefaultMaxOvertake)
	}
	rc.Admission.KVFit = c.KVFit
	if c.Admission != "" {
		rc.Admission.Mode = c.Admission
	}
	rc.Sessions.Affinity = c.SessionAffinity
	if c.SessionTTL > 0 {
		rc.Sessions.TTL = sd(c.SessionTTL)
	}
	if c.FairShareBySession {
		rc.Admission.FairShareBy = config.FairShareBySession
	}
	if len(c.SLOs) > 0 {
		// The objectives are of the scenario's clock: durations divided
		// by the scale, rates multiplied, as for the limits.
		rc.Admission.SLO = make(map[string]predict.SLO, len(c.SLOs))
		for class, slo := range c.SLOs {
			if slo.TTFT > 0 {
				slo.TTFT = sd(slo.TTFT)
			}
			if slo.TTFTPer1k > 0 {
				slo.TTFTPer1k = sd(slo.TTFTPer1k)
			}
			slo.MinDecode *= scale
			rc.Admission.SLO[class] = slo
		}
	}
	interval := c.ScrapeInterval
	if interval <= 0 {
		interval = time.Second
	}
	rc.Telemetry.Interval = sd(interval)
	rc.Telemetry.Timeout = max(sd(interval), 200*time.Millisecond)
	rc.Telemetry.StaleAfter = max(sd(c.StaleAfter), rc.Telemetry.Interval)
	model := c.Model
	for i, w := range c.Workers {
		m := model
		if m == "" {
			m = w.Params.Model
		}
		rc.Workers = append(rc.Workers, config.Worker{Name: w.Name, URL: urls[i], Kind: "llamacpp", Models: []string{m},
			MaxConcurrency: config.Concurrency(c.limitOf(w.Name)), GPUMetrics: urls[i] + "/dcgm/metrics"})
	}
	rc.Limits = routerLimits(c.Concurrency, scale)
	// Replicas sharing a Redis stats store see each other's samples at
	// each flush: as often in model time as a real router would.
	rc.Stats.FlushInterval = sd(rc.Stats.FlushInterval)
	return rc
}

// routerLimits is the config of lc for a fleet running scale times faster
// than model time: its durations divided by scale and its rates (measured
// on the wall clock) multiplied by it. Zero values keep the defaults.
func routerLimits(lc limit.Config, scale float64) config.Limits {
	l := config.DefaultConfig().Limits
	ll := &l.Learning
	ll.Fixed = lc.Fixed
	l.MinStreamTokS = lc.MinStreamTokS * scale
	if lc.FloorFraction > 0 {
		ll.FloorFraction = lc.FloorFraction
	}
	if lc.MinSamples > 0 {
		ll.MinSamples = lc.MinSamples
	}
	sd := func(d, def time.Duration) time.Duration {
		if d <= 0 {
			d = def
		}
		return max(time.Duration(float64(d)/scale), time.Millisecond)
	}
	ll.ProbeAfter = sd(lc.ProbeAfter, ll.ProbeAfter)
	ll.BorrowAfter = sd(lc.BorrowAfter, ll.BorrowAfter)
	if lc.DefaultCap > 0 {
		ll.DefaultCap = lc.DefaultCap
	}
	for m, f := range lc.ModelFloors {
		if l.Models == nil {
			l.Models = map[string]config.ModelTargets{}
		}
		l.Models[m] = config.ModelTargets{MinStreamTokS: f * scale}
	}
	return l
}

// RunHTTPStats runs items through a fresh fleet and router and returns the
// results converted to model time (Scheduled, Start, TTFT, E2E, TPOT and
// QueueMs multiplied by the time scale, DecodeRate divided by it), and
// what the routers did (HTTPStats). It starts the load once the router
// has scraped every worker as healthy. With hc.Replicas above 1 it runs
// that many routers sharing the fleet through Redis, behind a round-robin
// front.
func RunHTTPStats(ctx context.Context, hc HTTPConfig, items []bench.Item) ([]bench.Result, HTTPStats, error) {
	var st HTTPStats
	c := hc.Router
	if len(c.Workers) == 0 && len(hc.External) == 0 {
		return nil, st, errors.New("vsim: http: no workers")
	}
	if hc.Replicas > 1 && hc.Redis == "" {
		return nil, st, fmt.Errorf("vsim: http: %d replicas need a Redis to share state through", hc.Replicas)
	}
	if hc.KVEvents && (len(hc.External) > 0 || hc.Replicas > 1) {
		return nil, st, errors.New("vsim: http: KV events are published by the sim fleet to one router: not with running workers (give them kv_events in their config) nor with replicas")
	}
	scale := hc.TimeScale
	if scale <= 0 || len(hc.External) > 0 {
		scale = 1
	}
	log := hc.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var rc config.Config
	if len(hc.External) > 0 {
		rc = externalConfig(c, hc.External)
	} else {
		specs := make([]sim.WorkerSpec, len(c.Workers))
		for i, w := range c.Workers {
			specs[i] = w
			specs[i].TimeScale = scale
			if hc.KVEvents {
				specs[i].KVEvents, specs[i].KVEventsReplay = "127.0.0.1:0", "127.0.0.1:0"
			}
		}
		fl, err := sim.StartFleet(ctx, specs, "127.0.0.1", 0, log)
		if err != nil {
			return nil, st, fmt.Errorf("vsim: http: start fleet: %w", err)
		}
		defer fl.Close()
		for _, w := range fl.Workers() {
			select {
			case <-w.Server.Ready():
			case <-ctx.Done():
				return nil, st, fmt.Errorf("vsim: http: waiting for %s to load: %w", w.Name, ctx.Err())
			}
		}
		rc = RouterConfig(c, fl.URLs(), scale)
		if hc.KVEvents {
			for i, w := range fl.Workers() {
				rc.Workers[i].KVEvents, rc.Workers[i].KVEventsReplay = w.Server.KVEvents().Endpoints()
			}
		}
	}
	// Keep every decision of the run for the per-replica counts.
	rc.Decisions.RingSize = max(rc.Decisions.RingSize, 2*len(items)+64)
	peaks := newPeakCounter(rc.Workers)
	rs, err := startRouters(ctx, rc, hc, peaks, log)
	if rs != nil {
		defer rs.stop()
	}
	if err != nil {
		return nil, st, err
	}
	if hc.KVEvents {
		if err := joinKVEvents(ctx, rs.srvs[0], rc.Workers); err != nil {
			return nil, st, err
		}
	}
	model := c.Model
	if len(rc.Workers[0].Models) > 0 && model == "" {
		model = rc.Workers[0].Models[0]
	}
	if model == "" {
		model = rs.discoveredModel()
	}
	if model == "" {
		return nil, st, fmt.Errorf("vsim: http: %s lists no model to ask for", rc.Workers[0].Name)
	}

	scaled := make([]bench.Item, len(items))
	for i, it := range items {
		scaled[i] = it
		scaled[i].At = time.Duration(float64(it.At) / scale)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}}
	defer client.CloseIdleConnections()
	var timeout time.Duration
	if hc.Timeout > 0 {
		timeout = time.Duration(float64(hc.Timeout) / scale)
	}
	results, err := bench.Run(ctx, bench.RunConfig{Target: rs.target, Items: scaled, Model: model,
		Stream: true, Timeout: timeout, Client: client}, hc.Progress)
	if err != nil {
		return results, st, fmt.Errorf("vsim: http: run: %w", err)
	}
	up := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	for i := range results {
		r := &results[i]
		r.Scheduled = items[r.Index].At
		r.Start, r.Lateness = up(r.Start), up(r.Lateness)
		r.TTFT, r.E2E, r.TPOT = up(r.TTFT), up(r.E2E), up(r.TPOT)
		r.DecodeRate /= scale
		if r.QueueMs > 0 {
			r.QueueMs *= scale
		}
	}
	st, err = rs.finish(peaks)
	return results, st, err
}

// externalConfig is the router configuration for the scenario c against
// running workers: RouterConfig's settings at time scale 1, with the
// workers as given (max_concurrency from c where they set none).
func externalConfig(c Config, workers []config.Worker) config.Config {
	c.Workers = nil
	rc := RouterConfig(c, nil, 1)
	for _, w := range workers {
		if w.MaxConcurrency == 0 {
			w.MaxConcurrency = config.Concurrency(c.limitOf(w.Name))
		}
		rc.Workers = append(rc.Workers, w)
	}
	return rc
}

// waitHealthy waits until the router has scraped every worker of ws as
// healthy, with its slot count, its models when the config names none
// (discovered from /v1/models) and, for those with a GPU exporter, GPU
// readings, as a benchmark against a warm router would begin.
func waitHealthy(ctx context.Context, s *scheduler.Scheduler, ws []config.Worker) error {
	type needs struct{ gpu, models bool }
	need := make(map[string]needs, len(ws))
	for _, w := range ws {
		need[w.Name] = needs{gpu: w.GPUMetrics != "", models: len(w.Models) == 0}
	}
	ready := func(w scheduler.WorkerState) bool {
		n := need[w.Name]
		return w.Health == snapshot.HealthOK && w.Snapshot != nil && w.Snapshot.Slots > 0 &&
			(!n.gpu || w.Snapshot.GPUUtil.Known()) && (!n.models || len(w.Snapshot.Models) > 0)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		ok := 0
		for _, w := range s.Workers() {
			if ready(w) {
				ok++
			}
		}
		if ok == len(ws) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vsim: http: waiting for healthy workers: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("vsim: http: only %d of %d workers healthy after 30s", ok, len(ws))
		case <-tick.C:
		}
	}
}
