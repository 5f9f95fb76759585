package fleet

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/telemetry"
)

// Log keys, constant so logs can be queried.
const (
	keyWorker = "worker"
	keyURL    = "url"
	keyHealth = "health"
	keyFrom   = "from"
	keyReason = "reason"
	keyErr    = "err"
	keyModels = "models"
	keySlots  = "slots"
)

// Worker is one inference server as the fleet sees it. It is a
// scheduler.Source: Snapshot returns its latest published snapshot.
type Worker struct {
	cfg  WorkerConfig
	opts *Options
	log  *slog.Logger
	base string

	snap atomic.Pointer[snapshot.Snapshot]

	// round serialises probe rounds (the scraper's and ScrapeNow's).
	round sync.Mutex

	mu sync.Mutex
	st workerState // guarded by mu

	stop context.CancelFunc
	done chan struct{}
}

// workerState is everything mutable about a worker. One owner: the
// Worker's mutex; probes and request reports go through the same methods.
type workerState struct {
	probed // what State reports

	modelsAt time.Time
	propsAt  time.Time
	infoAt   time.Time
	tgiBatch int // TGI /info max_batch_total_tokens; 0 when unknown

	// What the worker says of its prompt cache besides probed's: the
	// model's BOS text from /props that starts each of llama.cpp's slot
	// prompts, and vLLM's prefix-cache counters at the last scrape.
	bos                       string
	prefixQueries, prefixHits float64
	prefixAt                  time.Time

	// kvPool is the KV cache one request draws from as vLLM reports it
	// (its smallest engine's); kvCells is the whole cache's size as
	// llama.cpp's /metrics imply it (cells in use over the fraction in
	// use), 0 until it has said both with some in use. See poolLocked.
	kvPool  int
	kvCells float64

	// adapters are the LoRA adapters the worker reports (lora.go).
	adapters []lora.Info
	// loadedAt are the adapters Sluice loaded, until a model list read
	// after the load confirms or denies them (withRecentLoads).
	loadedAt map[string]loadedAdapter
	loraErr  string
}

func newWorker(cfg WorkerConfig, opts *Options) *Worker {
	w := &Worker{
		cfg:  cfg,
		opts: opts,
		log:  opts.Logger.With(slog.String(keyWorker, cfg.Name)),
		base: strings.TrimRight(cfg.URL, "/"),
		done: make(chan struct{}),
		stop: func() {},
	}
	w.snap.Store(w.buildLocked())
	return w
}

// Snapshot returns the worker's latest snapshot. It never blocks and
// never returns nil; the snapshot must not be modified.
func (w *Worker) Snapshot() *snapshot.Snapshot { return w.snap.Load() }

// Config returns the worker's configuration (a copy).
func (w *Worker) Config() WorkerConfig { return w.cfg.clone() }

// Name returns the worker's name.
func (w *Worker) Name() string { return w.cfg.Name }

// ReportRequest records the outcome of a request Sluice proxied to the
// worker: nil is a pass, an error a failure, counted with failed probes
// towards FailThreshold. A cancelled context (the client went away) says
// nothing about the worker and is ignored.
func (w *Worker) ReportRequest(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	if err != nil {
		w.observe(outcome{kind: outcomeFail, reason: "request: " + err.Error()})
		return
	}
	w.observe(outcome{kind: outcomePass})
}

type outcomeKind int

const (
	outcomePass outcomeKind = iota
	outcomeFail
	outcomeLoading
)

type outcome struct {
	kind   outcomeKind
	reason string
}

// observe applies one health outcome, publishes the new snapshot, then
// logs and notifies when the health changed.
func (w *Worker) observe(o outcome) {
	w.mu.Lock()
	before, beforeReason := w.st.Health, w.st.Reason
	st := &w.st
	switch o.kind {
	case outcomeLoading:
		st.ConsecutiveFailures, st.ConsecutivePasses = 0, 0
		st.Health, st.Reason = snapshot.HealthLoading, o.reason
	case outcomePass:
		st.ConsecutiveFailures = 0
		st.ConsecutivePasses++
		if st.Health != snapshot.HealthDown || st.ConsecutivePasses >= w.opts.RiseThreshold {
			st.Health, st.Reason = snapshot.HealthOK, ""
		}
	case outcomeFail:
		st.ConsecutivePasses = 0
		st.ConsecutiveFailures++
		st.Reason = o.reason
		if st.ConsecutiveFailures >= w.opts.FailThreshold {
			st.Health = snapshot.HealthDown
		}
	}
	after, fails := st.Health, st.ConsecutiveFailures
	w.publishLocked()
	w.mu.Unlock()

	if after == before {
		if o.kind == outcomeFail && o.reason != beforeReason {
			w.log.Warn("worker failing", slog.String(keyHealth, after.String()),
				slog.Int("consecutive_failures", fails), slog.String(keyReason, o.reason))
		}
		return
	}
	level := slog.LevelInfo
	if after == snapshot.HealthDown {
		level = slog.LevelWarn
	}
	w.log.Log(context.Background(), level, "worker health changed",
		slog.String(keyFrom, before.String()), slog.String(keyHealth, after.String()),
		slog.String(keyReason, o.reason))
	w.notify()
}

func (w *Worker) notify() {
	if w.opts.OnChange != nil {
		w.opts.OnChange(w.cfg.Name)
	}
}

// publishLocked builds and stores a new snapshot; w.mu must be held.
func (w *Worker) publishLocked() { w.snap.Store(w.buildLocked()) }

func (w *Worker) buildLocked() *snapshot.Snapshot {
	st := &w.st
	return &snapshot.Snapshot{
		Health:        st.Health,
		HealthReason:  st.Reason,
		Models:        slices.Clone(st.Models),
		Slots:         st.Slots,
		ContextTokens: st.ContextTokens,
		QueueLen:      st.QueueLen,
		KVPressure:    st.KVPressure,
		GPUUtil:       st.GPUUtil,
		KVCacheTokens: st.KVCacheTokens,
		KVPoolTokens:  w.poolLocked(),
		PrefixHitRate: st.PrefixHitRate,
		CacheReport:   st.CacheReport,
		Adapters:      slices.Clone(st.adapters),
	}
}

// poolLocked is the capacity of the KV cache the worker's running
// requests share (Snapshot.KVPoolTokens), 0 when not known to be one
// pool. vLLM says it (num_gpu_blocks × block_size). llama.cpp says a
// slot's n_ctx, which is the whole cache when the slots share one
// (llama-server's unified KV cache) and a slot's own share otherwise,
// where a free slot always has room; the two differ only in the whole
// cache's size, which older builds' /metrics imply (kv_cache_tokens over
// kv_cache_usage_ratio): a slot's n_ctx is taken as the pool only when
// the whole cache is no larger (1% for rounding). Newer builds report
// neither, and the pool stays unknown: the KV-fit rule then does nothing
// for the worker rather than take a slot's share for a shared cache.
func (w *Worker) poolLocked() int {
	st := &w.st
	switch {
	case st.kvPool > 0:
		return st.kvPool
	case st.kvCells > 0 && st.KVCacheTokens > 0 && st.kvCells <= 1.01*float64(st.KVCacheTokens):
		return st.KVCacheTokens
	}
	return 0
}

// State is a worker's condition for the admin API.
type State struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	Kind string `json:"kind"`
	probed
	// ConfigModels are the models of the config.
	ConfigModels []string `json:"config_models,omitempty"`
	// Stale lists the readings older than StaleAfter.
	Stale []string `json:"stale,omitempty"`
}

// probed is what the probes and request reports found of a worker: kept
// under the Worker's mutex (workerState) and reported as it is (State).
type probed struct {
	Health snapshot.Health `json:"health"`
	// Reason says why the worker is not OK (last failure, loading).
	Reason string `json:"reason,omitempty"`
	// ConsecutiveFailures and ConsecutivePasses are the health counters.
	ConsecutiveFailures int `json:"consecutive_failures"`
	ConsecutivePasses   int `json:"consecutive_passes"`
	// LastScrape is when the last probe round started; LastError is its
	// failure, empty when it passed.
	LastScrape time.Time `json:"last_scrape,omitzero"`
	LastError  string    `json:"last_error,omitempty"`
	// MetricsError, GPUError, PropsError, ModelsError and SlotsError
	// (llama.cpp /slots) are the current telemetry problems, empty when
	// none.
	MetricsError string `json:"metrics_error,omitempty"`
	GPUError     string `json:"gpu_error,omitempty"`
	PropsError   string `json:"props_error,omitempty"`
	ModelsError  string `json:"models_error,omitempty"`
	SlotsError   string `json:"slots_error,omitempty"`
	// Models are the discovered models; nil until /v1/models answered.
	Models []string `json:"models"`
	// Slots is the reported slot count; 0 when unknown.
	Slots int `json:"slots,omitempty"`
	// ContextTokens is the reported per-slot context size; 0 when unknown.
	ContextTokens int `json:"context_tokens,omitempty"`
	// The readings, with their sources and times. Running is not part of
	// the scheduler's snapshot (Sluice counts its own in-flight requests)
	// but shows what the worker itself says.
	QueueLen   snapshot.Reading `json:"queue_len"`
	Running    snapshot.Reading `json:"running"`
	KVPressure snapshot.Reading `json:"kv_pressure"`
	GPUUtil    snapshot.Reading `json:"gpu_util"`
	// KVCacheTokens is the KV cache size the worker reports (it sizes the
	// router's prefix index); 0 when unknown.
	KVCacheTokens int `json:"kv_cache_tokens,omitempty"`
	// PrefixHitRate is the share of prompt tokens the worker found in its
	// own prefix cache between its last two scrapes (vLLM).
	PrefixHitRate snapshot.Reading `json:"prefix_hit_rate,omitzero"`
	// CacheReport summarises what the worker says its slots hold
	// (llama.cpp /slots with prompts, as block hashes); nil when it says
	// nothing.
	CacheReport *snapshot.CacheReport `json:"cache_report,omitempty"`
}

// State returns the worker's current condition.
func (w *Worker) State() State {
	now := w.opts.Now()
	w.mu.Lock()
	s := State{Name: w.cfg.Name, URL: w.cfg.URL, Kind: w.cfg.Kind, probed: w.st.probed, ConfigModels: slices.Clone(w.cfg.Models)}
	w.mu.Unlock()
	s.Models = slices.Clone(s.Models)
	for _, r := range []struct {
		name string
		r    snapshot.Reading
	}{{"queue_len", s.QueueLen}, {"running", s.Running}, {"kv_pressure", s.KVPressure}, {"gpu_util", s.GPUUtil}} {
		if r.r.Known() && now.Sub(r.r.At) > w.opts.StaleAfter {
			s.Stale = append(s.Stale, r.name)
		}
	}
	return s
}

// start launches the scraper goroutine.
func (w *Worker) start(ctx context.Context) {
	ctx, w.stop = context.WithCancel(ctx)
	go w.run(ctx)
}

// halt stops the scraper and waits for it.
func (w *Worker) halt() {
	w.stop()
	<-w.done
}

func (w *Worker) run(ctx context.Context) {
	defer close(w.done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.ScrapeNow(ctx)
		t.Reset(w.opts.Interval)
	}
}

// ScrapeNow runs one probe round in the caller's goroutine, after any
// round in progress. A cancelled ctx ends the round without recording
// anything about the worker.
func (w *Worker) ScrapeNow(ctx context.Context) {
	w.round.Lock()
	defer w.round.Unlock()
	w.scrape(ctx)
	if w.opts.afterRound != nil {
		w.opts.afterRound(w.cfg.Name)
	}
}

// setTelemetryErr records the current problem of one telemetry source,
// logging only when it changes (so a broken /metrics makes one line, not
// one a second).
func (w *Worker) setTelemetryErr(field *string, what, url string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	w.mu.Lock()
	prev := *field
	*field = msg
	w.mu.Unlock()
	switch {
	case msg == prev:
	case msg == "":
		w.log.Info(what+" recovered", slog.String(keyURL, url))
	case errors.Is(err, telemetry.ErrMissing):
		w.log.Warn(what+" incomplete; absent readings will grow stale", slog.String(keyURL, url), slog.String(keyErr, msg))
	default:
		w.log.Warn(what+" unusable; readings will grow stale", slog.String(keyURL, url), slog.String(keyErr, msg))
	}
}
