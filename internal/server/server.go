// Package server assembles a Sluice router from its parts — fleet,
// scheduler, stats, decisions, proxy, metrics — and serves its HTTP API:
// the OpenAI-compatible inference routes, /v1/models, the explanation
// endpoints (/debug/decisions, /api/workers), the live dashboard at "/"
// with its /api/overview, /metrics, /healthz and /readyz, and the admin API that adds, drains and removes workers at run
// time.
//
// # Concurrency Model
//
// The Server itself holds only wiring; each part guards its own state.
// Worker membership changes (admin API, config reload, discovery) are
// serialised by one mutex, which keeps the fleet and the scheduler in
// step: a worker is added to the fleet before the scheduler can pick it,
// and removed from the scheduler before its scraper stops. What the
// router keeps of a worker outside the scheduler hangs from its member
// (member.go), which the scheduler's retirement of the worker drops.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/dashboard"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/fleet"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/prefixshare"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// Server is one Sluice router.
type Server struct {
	log    *slog.Logger
	cfg    config.Config
	sched  *scheduler.Scheduler
	prefix *prefix.Index // where prompt prefixes were sent
	// prefixShare shares prefix with the other replicas; nil when the
	// router keeps no state in Redis.
	prefixShare *prefixshare.Index
	fleet       *fleet.Fleet
	lora        *loraLoader // the scheduler's AdapterLoader
	kv          *kvEvents   // the workers' KV-cache events (kvevents.go)
	tracker     *stats.Tracker
	store       stats.Store
	dlog        *decisions.Log
	shared      *sharedState
	metrics     *metrics
	dash        *dashboard.Dashboard
	proxy       *proxy.Handler
	mux         *http.ServeMux
	patterns    []string                     // every pattern on mux, in order
	handler     http.Handler                 // mux behind auth and limits
	keys        atomic.Pointer[auth.Keyring] // swapped whole on reload
	// transport sends to workers, each with its own TLS settings.
	transport *workerTransport
	// stopping is set when shutdown begins: /readyz turns 503.
	stopping atomic.Bool
	// openFiles returns the process's open-file limit; a test may fake it.
	openFiles func() (uint64, error)
	// after is time.After unless a test steers the shutdown phases and
	// drain deadlines.
	after func(time.Duration) <-chan time.Time
	// inFlight counts the inference requests being served, queued ones
	// included; idle gets a value each time it drops to 0.
	inFlight atomic.Int64
	idle     chan struct{}
	// console keeps the counts of the traffic line; summaryTick, when a
	// test sets it, times the lines instead of a summaryInterval ticker.
	console     console
	summaryTick <-chan time.Time
	stopBg      context.CancelFunc
	bgDone      chan struct{}

	// listenLoopback: cfg.Listen takes connections from this host alone.
	// Only then do admin routes answer loopback clients without a token:
	// on an address the network reaches, a loopback client may be
	// anything on the host in front of Sluice (an ingress, a sidecar, a
	// port-forward) relaying anyone's request, and the admin API can point
	// the fleet at any URL.
	listenLoopback bool

	memberMu sync.Mutex // serialises worker membership changes
	members  members    // each worker's life outside the scheduler (member.go)
}

// Options are the parts a caller may supply instead of the defaults.
type Options struct {
	// Logger; slog.Default when nil.
	Logger *slog.Logger
	// Transport sends requests and probes to workers.
	Transport http.RoundTripper
	// Tracer, when not nil, traces every proxied request.
	Tracer proxy.Tracer
}

// tokenizeTimeout bounds a KV-events worker's /tokenize for a request's
// token ids; past it the request goes on with the prefix term's guess.
const tokenizeTimeout = 200 * time.Millisecond

// New builds a router from cfg: it opens the stats store (each worker's
// averages are loaded as it is added), the decision log, and starts
// probing every worker.
func New(cfg config.Config, opt Options) (*Server, error) {
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{log: log, cfg: cfg, mux: http.NewServeMux(), bgDone: make(chan struct{}), idle: make(chan struct{}, 1),
		listenLoopback: loopbackOnly(cfg.Listen), openFiles: openFileLimit, after: time.After}
	if err := s.loadKeys(cfg.Auth); err != nil {
		return nil, err
	}
	var err error
	if redisconn.IsURL(cfg.Stats.Store) {
		if s.store, err = stats.OpenRedis(cfg.Stats.Store, cfg.Stats.RedisPrefix); err != nil {
			return nil, err
		}
	} else if cfg.Stats.Store != "" && cfg.Stats.Store != config.StatsMemory {
		if s.store, err = stats.OpenBolt(cfg.Stats.Store, log); err != nil {
			return nil, err
		}
	}
	if s.tracker, err = stats.NewTracker(stats.Alpha, s.store, log); err != nil {
		s.closeStore()
		return nil, err
	}
	if s.dlog, err = decisions.NewLog(cfg.Decisions.RingSize, cfg.Decisions.File); err != nil {
		s.closeStore()
		return nil, err
	}
	if s.shared, err = openShared(cfg.Shared, cfg.Listen, s); err != nil {
		s.closeStore()
		return nil, err
	}
	var ledger scheduler.Ledger
	if s.shared.ledger != nil {
		ledger = s.shared.ledger.ForScheduler(s.shared.ctx)
	}
	s.prefix = prefix.NewIndex(prefix.Options{})
	var prefixIndex scheduler.PrefixIndex = s.prefix
	if s.prefixShare, err = openPrefixShare(cfg, s.prefix, s); err != nil {
		s.shared.close()
		s.closeStore()
		return nil, err
	} else if s.prefixShare != nil {
		prefixIndex = s.prefixShare
	}
	s.lora = newLoRALoader(s)
	s.kv = newKVEvents(log, tokenizeTimeout)
	s.sched, err = scheduler.New(scheduler.Config{
		KVIndex:       s.kv.index,
		Adapters:      s.adapterConfig(cfg),
		Ledger:        ledger,
		IDPrefix:      s.shared.idPrefix(),
		Weights:       cfg.Weights.Scheduler(),
		MaxQueue:      cfg.Admission.MaxQueue,
		MaxQueueBytes: queuedBodies * cfg.Proxy.MaxBodyBytes,
		QueueTimeout:  cfg.Admission.QueueTimeout,
		Classes:       cfg.Admission.Classes,
		TenantWeights: cfg.Admission.TenantWeights,
		MaxOvertake:   cfg.Admission.MaxOvertake,
		KVFit:         cfg.Admission.KVFit,
		StaleAfter:    cfg.Telemetry.StaleAfter,
		Limits:        cfg.Limits.Scheduler(),
		Policy:        cfg.Policy,
		Stats:         s.tracker,
		Recorder:      s.record,
		PrefixIndex:   prefixIndex,
		// A session goes back to its worker (scheduler/sessions.go).
		SessionAffinity: cfg.Sessions.Affinity,
		SessionTTL:      cfg.Sessions.TTL,
		MaxSessions:     cfg.Sessions.MaxSessions,
		Predictor:       predict.New(s.tracker),
		Admission:       cfg.Admission.Mode,
		SLOs:            cfg.Admission.SLO,
		Retired:         s.retire,
	})
	if err != nil {
		s.shared.close()
		s.closeStore()
		return nil, err
	}
	if opt.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = cfg.Proxy.ResponseHeaderTimeout
		t.MaxIdleConnsPerHost = idleConnsPerWorker(cfg)
		// Each worker's host gets its own clone of t (transport.go), so
		// the total is per worker too: DefaultTransport's 100 would close
		// every connection past the hundredth a busy worker hands back,
		// and dial it again on the next burst.
		t.MaxIdleConns = t.MaxIdleConnsPerHost
		opt.Transport = t
	}
	s.transport = newWorkerTransport(opt.Transport, cfg.Proxy.IdleConnTimeoutFor)
	opt.Transport = s.transport
	client := &http.Client{Transport: opt.Transport}
	s.fleet = fleet.New(fleet.Options{
		Client:        client,
		Interval:      cfg.Telemetry.Interval,
		Timeout:       cfg.Telemetry.Timeout,
		StaleAfter:    cfg.Telemetry.StaleAfter,
		FailThreshold: cfg.Telemetry.FailThreshold,
		Logger:        log,
		OnChange:      s.workerChanged,
	})
	s.metrics = newMetrics(s.sched, s.tracker)
	s.metrics.reg.MustRegister(s.shared.collectors()...)
	s.metrics.reg.MustRegister(prefixShareCollectors(s.prefixShare)...)
	s.metrics.reg.MustRegister(s.lora.collectors()...)
	s.dash = dashboard.New(dashboard.Options{
		Workers:     s.sched.Workers,
		Gauges:      s.sched.Gauges,
		QueueDepths: s.sched.QueueDepths,
		Stats:       s.tracker.Get,
		Recent:      s.dlog.Recent,
	})
	s.proxy = proxy.New(proxy.Options{
		Scheduler:   s.sched,
		Resolve:     s.resolve,
		Credentials: s.credentials,
		Observer:    s.tracker,
		Reporter:    s,
		OnResult: func(r proxy.Result) {
			s.observe(r)
			s.dash.Observe(r)
			s.fileFirstToken(r)
			s.fileContinuations(r)
			s.console.observe(r)
		},
		Transport:    opt.Transport,
		MaxBodyBytes: cfg.Proxy.MaxBodyBytes,
		BodyTimeout:  bodyTimeout(cfg),
		MaxAttempts:  cfg.Proxy.MaxAttempts,
		IdleTimeout:  cfg.Proxy.StreamIdleTimeout,
		KVBlocks:     s.kvBlocks,
		Logger:       log,
		Tracer:       opt.Tracer,
		// Agent sessions (proxy/session.go).
		SessionHeaders:     cfg.Sessions.Headers,
		FairShareBySession: cfg.Admission.FairShareBy == config.FairShareBySession,
		// A stream broken mid-way goes on elsewhere; each worker's kind
		// says how to ask for the rest.
		MaxContinuations: cfg.Proxy.MaxContinuations,
		KindOf:           s.kindOf,
	})
	for _, w := range cfg.Workers {
		if err := s.addWorker(w); err != nil {
			s.Close()
			return nil, err
		}
	}
	bg, stop := context.WithCancel(context.Background())
	s.stopBg = stop
	go func() {
		defer close(s.bgDone)
		var wg sync.WaitGroup
		wg.Go(func() { s.dash.Run(bg) })
		wg.Go(func() { s.shared.run(bg, s.sched.Kick) })
		if s.prefixShare != nil {
			wg.Go(func() { s.prefixShare.Run(bg) })
		}
		s.tracker.Run(bg, cfg.Stats.FlushInterval)
		wg.Wait()
	}()
	s.routes()
	s.handler = s.guard(s.mux)
	s.logAuthMode()
	return s, nil
}

// Handler returns the router's HTTP handler: the routes behind
// authentication and per-key limits.
func (s *Server) Handler() http.Handler { return s.handler }

// Scheduler returns the router's scheduler (for demos and tests).
func (s *Server) Scheduler() *scheduler.Scheduler { return s.sched }

// ScrapeNow runs one probe round of every worker and returns when all are
// done, so what the workers report now is what the next decision sees.
func (s *Server) ScrapeNow(ctx context.Context) {
	for _, w := range s.fleet.List() {
		w.ScrapeNow(ctx)
	}
}

// Decisions returns the router's decision log.
func (s *Server) Decisions() *decisions.Log { return s.dlog }

// Close stops probes, flushes the averages and closes the stores.
func (s *Server) Close() error {
	s.stopDrains("")
	s.sched.Close()
	if s.kv != nil {
		s.kv.close() // every subscriber's goroutine ends here
	}
	if s.fleet != nil {
		s.fleet.Close()
	}
	if s.transport != nil {
		s.transport.CloseIdleConnections() // no keep-alive goroutines outlive the router
	}
	if s.stopBg != nil {
		s.stopBg()
		<-s.bgDone // Run flushes once more on its way out
	} else if err := s.tracker.Flush(context.Background()); err != nil {
		s.log.Error("flush stats", "err", err)
	}
	if s.shared != nil {
		s.shared.close()
	}
	err := s.dlog.Close()
	return errors.Join(err, s.closeStore())
}

func (s *Server) closeStore() error {
	if s.store == nil {
		return nil
	}
	return s.store.Close()
}

// record is the scheduler's Recorder: ring buffer, file, dashboard, and
// a log line at debug level (the console's traffic line sums them up).
func (s *Server) record(r *decisions.Record) {
	s.dlog.Add(r)
	s.dash.Decision(r)
	if !s.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"id", r.ID, "model", r.Model, "outcome", r.Outcome, "queue_ms", r.QueueWaitMs, "attempt", r.Attempt}
	// Another reader (GET /api/workers, the dashboard) may be building the
	// record's candidates right now: read only what Explain never writes
	// (the Summary; Reason of a refusal).
	if r.Chosen != "" {
		attrs = append(attrs, "worker", r.Chosen, "score", r.Summary.Score)
	}
	attrs = append(attrs, "eligible", r.Summary.Eligible, "candidates", r.Summary.Candidates)
	if r.Chosen == "" && r.Reason != "" { // refusals; a binding's reason is built when its record is read
		attrs = append(attrs, "reason", r.Reason)
	}
	s.log.Debug("decision", attrs...)
}

// fileFirstToken adds a streamed request's time to first token, as the
// client saw it and the worker's share, to the decision that placed it:
// its record in the ring and a line in the decision file.
func (s *Server) fileFirstToken(r proxy.Result) {
	if r.Decision == nil || r.TTFT <= 0 {
		return
	}
	s.dlog.AddFirstToken(r.Decision, decisions.FirstToken{TTFTMs: millis(r.TTFT), WorkerTTFTMs: millis(r.WorkerTTFT), DecodeTPS: decodeRate(r.TPOT)})
}

// decodeRate is the tokens per second of a time per output token, 0 when
// unknown.
func decodeRate(tpot time.Duration) float64 {
	if tpot <= 0 {
		return 0
	}
	return float64(time.Second) / float64(tpot)
}

// millis is d in milliseconds, as decision records give times.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ReportRequest passes a request's outcome on a worker to its health.
func (s *Server) ReportRequest(worker string, err error) {
	if w := s.fleet.Get(worker); w != nil {
		w.ReportRequest(err)
	}
}

// observe puts a result in the metrics. It holds the members' read lock:
// a worker retired meanwhile gets no series back (members).
func (s *Server) observe(r proxy.Result) {
	s.members.mu.RLock()
	defer s.members.mu.RUnlock()
	s.metrics.observe(r, s.members.liveLocked)
}

// addWorker starts probing w and makes it schedulable.
func (s *Server) addWorker(w config.Worker) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	return s.addWorkerLocked(w)
}

func (s *Server) addWorkerLocked(w config.Worker) error {
	m, err := s.newMember(w)
	if err != nil {
		return err
	}
	old := s.join(m) // its transport before its first probe
	fw, err := s.fleet.Add(context.Background(), s.fleetConfig(w, m.key))
	if err != nil {
		s.leave(m, old)
		return err
	}
	// Its stored averages, before it serves: a worker known slow before a
	// restart or a removal is still known slow.
	if err := s.tracker.Track(context.Background(), w.Name); err != nil {
		s.log.Error("could not load the worker's stored averages; it starts without them", "worker", w.Name, "err", err)
	}
	if err := s.sched.AddWorker(workerSpec(w, fw)); err != nil {
		s.fleet.Remove(w.Name)
		s.leave(m, old)
		return err
	}
	if old != nil {
		// Back under its name: its streams still running stay there,
		// counted against its limit, instead of moving at a deadline.
		if stop := s.takeDrain(old); stop != nil {
			stop()
		}
	}
	s.kv.start(w)
	return nil
}

// replaceWorkerLocked applies a changed worker's settings: its scraper is
// replaced (the URL or kind may have changed), and the scheduler's worker
// is updated in place, keeping its in-flight count. On a bad setting the
// running worker is left as it was.
func (s *Server) replaceWorkerLocked(w config.Worker) error {
	m, err := s.newMember(w)
	if err != nil {
		return err
	}
	if err := s.fleet.Remove(w.Name); err != nil {
		return err
	}
	old := s.join(m)
	fw, err := s.fleet.Add(context.Background(), s.fleetConfig(w, m.key))
	if err != nil {
		s.leave(m, old)
		return err
	}
	if old != nil {
		s.setDrain(w.Name, s.takeDrain(old))
	}
	s.kv.stop(w.Name) // its endpoints may have changed: the index starts over
	s.kv.start(w)
	return s.sched.UpdateWorker(workerSpec(w, fw))
}

// workerChanged is the fleet's OnChange: a worker's health, models or
// slots changed, which may make queued requests placeable, and a worker
// back from down may be a restarted engine (kvEvents.health).
func (s *Server) workerChanged(name string) {
	s.sched.Kick()
	if fw := s.fleet.Get(name); fw != nil {
		if snap := fw.Snapshot(); snap != nil {
			s.kv.health(name, snap.Health)
		}
	}
}

// removeWorkerLocked stops scheduling to a worker and stops probing it.
// Requests in flight on it finish normally; when the last of them ends
// the scheduler retires it (Server.retire), and its stats and predictor
// forget it.
func (s *Server) removeWorkerLocked(name string) error {
	s.setLeaving(name, true) // before the scheduler may retire it
	if err := s.sched.RemoveWorker(name); err != nil {
		s.setLeaving(name, false)
		return err
	}
	s.fleet.Remove(name)
	s.kv.stop(name)
	s.prefix.Forget(name) // a worker added again under this name starts cold
	// Its member stays for requests already bound to the worker, which
	// keep streaming until the drain deadline moves them.
	s.drainAt(name, s.cfg.Proxy.DrainDeadline)
	return nil
}

// Reload applies a new config's worker list: workers that are new are
// added, workers no longer listed are removed, workers whose settings
// changed are replaced. Other settings need a restart, and Reload says so.
func (s *Server) Reload(cfg config.Config) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	var errs []error
	if err := s.loadKeys(cfg.Auth); err != nil {
		errs = append(errs, fmt.Errorf("%w (keeping the running keys)", err))
	} else {
		s.cfg.Auth = cfg.Auth
	}
	old := map[string]config.Worker{}
	for _, w := range s.cfg.Workers {
		old[w.Name] = w
	}
	next := map[string]bool{}
	var kept []config.Worker
	for _, w := range cfg.Workers {
		next[w.Name] = true
		o, ok := old[w.Name]
		var err error
		switch {
		case ok && reflect.DeepEqual(o, w): // not JSON: that redacts the API key
		case ok:
			// Changed in place: new probes and address, the same
			// scheduler worker, so its requests in flight keep counting.
			err = s.replaceWorkerLocked(w)
		default:
			err = s.addWorkerLocked(w)
		}
		if err != nil {
			errs = append(errs, err)
			if ok {
				kept = append(kept, o) // left running as it was
			}
			continue
		}
		kept = append(kept, w)
	}
	for name := range old {
		if !next[name] {
			if err := s.removeWorkerLocked(name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.cfg.Workers = kept
	if ignored := changedNonWorkerKeys(s.cfg, cfg); len(ignored) > 0 {
		s.log.Warn("config reload applies the worker list only; restart to apply the rest", "changed", ignored)
	}
	s.log.Info("config reloaded", "workers", len(kept), "errors", len(errs))
	return errors.Join(errs...)
}

// changedNonWorkerKeys names the top-level settings that differ between
// the running config and a reloaded one, other than the worker list.
func changedNonWorkerKeys(running, next config.Config) []string {
	running.Workers, next.Workers = nil, nil
	section := func(c config.Config) map[string]string {
		var m map[string]any
		raw, _ := yaml.Marshal(c)
		yaml.Unmarshal(raw, &m)
		out := map[string]string{}
		for k, v := range m {
			b, _ := yaml.Marshal(v)
			out[k] = string(b)
		}
		return out
	}
	a, b := section(running), section(next)
	var out []string
	for k := range a {
		if a[k] != b[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// AddWorker adds a worker at run time (admin API).
func (s *Server) AddWorker(w config.Worker) error {
	if w.Kind == "" {
		w.Kind = fleet.KindLlamaCPP
	}
	s.memberMu.Lock() // Reload writes s.cfg under it
	defer s.memberMu.Unlock()
	c := s.cfg
	c.Workers = []config.Worker{w}
	if err := c.Validate(); err != nil {
		return err
	}
	if slices.ContainsFunc(s.cfg.Workers, func(x config.Worker) bool { return x.Name == w.Name }) {
		return fmt.Errorf("worker %q already exists", w.Name)
	}
	if err := s.addWorkerLocked(w); err != nil {
		return err
	}
	s.cfg.Workers = append(s.cfg.Workers, w)
	return nil
}

// RemoveWorker removes a worker at run time (admin API).
func (s *Server) RemoveWorker(name string) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	if err := s.removeWorkerLocked(name); err != nil {
		return err
	}
	s.cfg.Workers = slices.DeleteFunc(s.cfg.Workers, func(x config.Worker) bool { return x.Name == name })
	return nil
}

// idleConnsPerWorker is how many idle keep-alive connections the proxy
// keeps to each worker: one per request it may run there at once, so a
// burst that ends does not close connections the next burst redials. It
// is the largest configured max_concurrency, and at least 64 for workers
// whose limit is learned. The worker's own idle timeout (see
// proxy.idle_conn_timeout) still closes them when they sit unused.
func idleConnsPerWorker(cfg config.Config) int {
	n := 64
	for _, w := range cfg.Workers {
		n = max(n, int(w.MaxConcurrency))
	}
	if cfg.Discovery.Kubernetes != nil {
		n = max(n, int(cfg.Discovery.Kubernetes.MaxConcurrency))
	}
	return n
}
