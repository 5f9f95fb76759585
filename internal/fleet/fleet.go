package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Worker kinds: which server a worker runs, and so what is probed.
const (
	KindLlamaCPP = "llamacpp"
	KindVLLM     = "vllm"
	KindOpenAI   = "openai"
	KindSGLang   = "sglang" // started with --enable-metrics
	KindOllama   = "ollama" // requests go to its OpenAI endpoints under /v1
	KindTGI      = "tgi"    // Hugging Face text-generation-inference
	KindTRTLLM   = "trtllm" // NVIDIA TensorRT-LLM's trtllm-serve
)

// Kinds lists every worker kind, in the order documentation shows them.
var Kinds = []string{KindLlamaCPP, KindVLLM, KindSGLang, KindTGI, KindTRTLLM, KindOllama, KindOpenAI}

// WorkerConfig describes one worker.
type WorkerConfig struct {
	// Name identifies the worker; unique within a Fleet.
	Name string `json:"name"`
	// URL is the server's root, e.g. http://10.0.0.5:8080, without /v1:
	// probes append /health, /metrics, /props and /v1/models.
	URL string `json:"url"`
	// Kind is one of Kinds (KindLlamaCPP, KindVLLM, ...).
	Kind string `json:"kind"`
	// Models are the models the worker serves according to the config;
	// the scheduler uses them until /v1/models has answered. For vLLM a
	// single model here also picks its series from /metrics when the
	// server exposes several.
	Models []string `json:"models,omitempty"`
	// GPUMetrics is the full URL of a dcgm-exporter /metrics for the
	// worker's GPU; empty when there is none.
	GPUMetrics string `json:"gpu_metrics,omitempty"`
	// GPUSelector picks the worker's GPU among those the exporter serves,
	// by label, e.g. {"gpu": "1"} or {"UUID": "GPU-..."}. It may be empty
	// when the exporter serves one GPU.
	GPUSelector map[string]string `json:"gpu_selector,omitempty"`
	// AdapterPaths names llama.cpp's LoRA files by path (the config's
	// adapters.adapters[].path to .name); a file not named here is named
	// by its base name.
	AdapterPaths map[string]string `json:"adapter_paths,omitempty"`
	// APIKey, when set, is sent as "Authorization: Bearer" on every probe
	// of the worker's own URL (never to GPUMetrics, another server). It is
	// a secret: never marshalled.
	APIKey string `json:"-"`
}

// clone returns a deep copy, so a caller's later edits never reach a
// running worker.
func (c WorkerConfig) clone() WorkerConfig {
	c.Models = slices.Clone(c.Models)
	c.GPUSelector = maps.Clone(c.GPUSelector)
	return c
}

// Options configure a Fleet. The zero value works: every field has a
// default.
type Options struct {
	// Client makes the probes; default a client with no overall timeout
	// (each probe has its own, see Timeout).
	Client *http.Client
	// Interval is the pause between the end of one probe round of a
	// worker and the start of its next; default 1s.
	Interval time.Duration
	// Timeout bounds each HTTP probe; default Interval. Not half an
	// interval: a busy llama.cpp answers /health and /metrics through its
	// task queue, and a tight timeout would eject a worker for being
	// busy. Rounds never overlap, so a slow probe only delays the same
	// worker's next round.
	Timeout time.Duration
	// StaleAfter is the age past which State reports a reading as stale;
	// default 3 intervals. Readings keep their time, so the scheduler
	// judges staleness itself from Reading.At.
	StaleAfter time.Duration
	// FailThreshold is the number of consecutive failures (probes or
	// requests) that ejects a worker; default 3.
	FailThreshold int
	// RiseThreshold is the number of consecutive passes that re-admits an
	// ejected worker; default 2, so one lucky answer of a flapping worker
	// does not bring it back.
	RiseThreshold int
	// ModelRefresh is how often /v1/models (and llama.cpp's /props) is
	// re-read; default 10s. They are also re-read whenever a worker
	// becomes healthy.
	ModelRefresh time.Duration
	// Logger receives state changes; default slog.Default().
	Logger *slog.Logger
	// OnChange is called with a worker's name after its health, models or
	// slot count changed, which may make queued requests placeable. It is
	// called without any fleet lock held and must not block for long.
	OnChange func(name string)
	// Now tells the time of readings and scrapes; default time.Now.
	Now func() time.Time

	// afterRound, when set, is called after every probe round (tests).
	afterRound func(name string)
}

func (o Options) withDefaults() Options {
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = o.Interval
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = 3 * o.Interval
	}
	if o.FailThreshold <= 0 {
		o.FailThreshold = 3
	}
	if o.RiseThreshold <= 0 {
		o.RiseThreshold = 2
	}
	if o.ModelRefresh <= 0 {
		o.ModelRefresh = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Errors of Fleet methods.
var (
	// ErrExists means a worker of that name is already in the fleet.
	ErrExists = errors.New("worker already exists")
	// ErrUnknownWorker means no worker has that name.
	ErrUnknownWorker = errors.New("unknown worker")
	// ErrClosed means the fleet was closed.
	ErrClosed = errors.New("fleet closed")
)

// Fleet is the set of workers and their scrapers.
type Fleet struct {
	opts Options

	mu      sync.Mutex
	workers map[string]*Worker
	closed  bool
}

// New returns an empty Fleet; Add workers to it.
func New(opts Options) *Fleet {
	return &Fleet{opts: opts.withDefaults(), workers: map[string]*Worker{}}
}

// Add adds the worker, whose cfg its caller has validated (config.Worker),
// and starts its scraper, whose first round begins at once. The worker's
// snapshot starts as HealthUnknown (eligible) with the config's models.
// ctx's values reach the scraper but its cancellation does not: the
// scraper runs until Remove or Close.
func (f *Fleet) Add(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("add worker %q: %w", cfg.Name, ErrClosed)
	}
	if _, ok := f.workers[cfg.Name]; ok {
		return nil, fmt.Errorf("add worker %q: %w", cfg.Name, ErrExists)
	}
	w := newWorker(cfg.clone(), &f.opts)
	f.workers[cfg.Name] = w
	w.start(context.WithoutCancel(ctx))
	return w, nil
}

// Remove stops the named worker's scraper, waits for it to end and drops
// the worker. Its last snapshot stays readable by whoever holds it.
func (f *Fleet) Remove(name string) error {
	f.mu.Lock()
	w, ok := f.workers[name]
	delete(f.workers, name)
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("remove worker %q: %w", name, ErrUnknownWorker)
	}
	w.halt()
	return nil
}

// Get returns the named worker, or nil.
func (f *Fleet) Get(name string) *Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.workers[name]
}

// List returns the workers sorted by name.
func (f *Fleet) List() []*Worker {
	f.mu.Lock()
	ws := make([]*Worker, 0, len(f.workers))
	for _, w := range f.workers {
		ws = append(ws, w)
	}
	f.mu.Unlock()
	slices.SortFunc(ws, func(a, b *Worker) int { return strings.Compare(a.cfg.Name, b.cfg.Name) })
	return ws
}

// Close stops every scraper and waits for them; Add fails afterwards.
func (f *Fleet) Close() {
	f.mu.Lock()
	f.closed = true
	ws := f.workers
	f.workers = map[string]*Worker{}
	f.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
	for _, w := range ws {
		<-w.done
	}
}
