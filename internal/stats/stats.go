// Package stats keeps what each worker has really achieved — time to first
// token, decode tokens/s, output length — as exponential moving averages,
// and persists them outside the process so a worker known to be slow is
// still known slow after a restart.
//
// # Concurrency Model
//
// A Tracker is the single owner of the averages: the proxy writes them
// (Observe, serialised by a mutex) and the scheduler reads them (Stats)
// without a lock, from a copy-on-write map of immutable values. Persistence is
// a separate, explicit step (Flush, or Run's ticker) that copies the dirty
// entries under the lock and writes them to the Store outside it, so a slow
// disk never stalls a routing decision.
package stats

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// EMA is an exponential moving average with the number of samples folded
// into it. The zero EMA has no history.
type EMA struct {
	// Value is the current average.
	Value float64 `json:"value"`
	// N counts the samples folded in; 0 means no history.
	N int64 `json:"n"`
}

// Add folds sample x into the average with smoothing factor alpha (0..1]:
// the first sample sets the value, later ones move it by alpha of the gap.
func (e EMA) Add(x, alpha float64) EMA {
	if e.N == 0 {
		return EMA{Value: x, N: 1}
	}
	return EMA{Value: e.Value + alpha*(x-e.Value), N: e.N + 1}
}

// Known reports whether the average has any history.
func (e EMA) Known() bool { return e.N > 0 }

// WorkerStats is what Sluice has measured of one worker.
type WorkerStats struct {
	// TTFTMs is time to first token, in milliseconds, seen by Sluice
	// (worker queueing and prefill included).
	TTFTMs EMA `json:"ttft_ms"`
	// DecodeTPS is per-stream decode throughput in tokens/s after the
	// first token.
	DecodeTPS EMA `json:"decode_tps"`
	// OutputTokens is the number of tokens a request produced; it stands in
	// for the unknowable output length of the next request.
	OutputTokens EMA `json:"output_tokens"`
	// E2EMs is end-to-end request time in milliseconds.
	E2EMs EMA `json:"e2e_ms"`
	// Updated is when the stats last changed.
	Updated time.Time `json:"updated"`
}

// Observation is one finished request's measurements. Zero fields are not
// folded in (a non-streaming request has no separate TTFT, a request of one
// token has no decode rate).
type Observation struct {
	TTFT         time.Duration
	E2E          time.Duration
	OutputTokens int
	// DecodeTPS is the decode rate after the first token; 0 if unknown.
	DecodeTPS float64
}

// Store persists WorkerStats. Implementations must make Save atomic: after
// a crash the store holds either the old or the new value of each entry,
// never a torn one.
type Store interface {
	// Load returns every stored entry.
	Load(ctx context.Context) (map[string]WorkerStats, error)
	// Save writes the given entries, replacing older values.
	Save(ctx context.Context, entries map[string]WorkerStats) error
	// Close releases the store.
	Close() error
}

// Tracker owns the moving averages of every worker.
type Tracker struct {
	alpha float64
	store Store
	log   *slog.Logger

	mu sync.Mutex // serialises writers
	// stats is a copy-on-write map of immutable values: Observe publishes
	// a new map with the entry's new pointer, so the scheduler reads
	// every worker's stats on each pick without taking a lock.
	stats atomic.Pointer[map[string]*WorkerStats]
	dirty map[string]bool
}

// NewTracker returns a Tracker smoothing with alpha, persisting to store
// (nil: memory only), and loads what the store already holds.
func NewTracker(ctx context.Context, alpha float64, store Store, log *slog.Logger) (*Tracker, error) {
	if alpha <= 0 || alpha > 1 {
		return nil, fmt.Errorf("stats: alpha %v outside (0, 1]", alpha)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{alpha: alpha, store: store, log: log, dirty: map[string]bool{}}
	m := map[string]*WorkerStats{}
	t.stats.Store(&m)
	if store != nil {
		loaded, err := store.Load(ctx)
		if err != nil {
			return nil, fmt.Errorf("stats: load: %w", err)
		}
		for name, ws := range loaded {
			m[name] = &ws
		}
	}
	return t, nil
}

// Observe folds one finished request on worker into its averages.
func (t *Tracker) Observe(worker string, o Observation, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s WorkerStats
	cur := *t.stats.Load()
	if old := cur[worker]; old != nil {
		s = *old
	}
	if o.TTFT > 0 {
		s.TTFTMs = s.TTFTMs.Add(ms(o.TTFT), t.alpha)
	}
	if o.E2E > 0 {
		s.E2EMs = s.E2EMs.Add(ms(o.E2E), t.alpha)
	}
	if o.OutputTokens > 0 {
		s.OutputTokens = s.OutputTokens.Add(float64(o.OutputTokens), t.alpha)
	}
	if o.DecodeTPS > 0 {
		s.DecodeTPS = s.DecodeTPS.Add(o.DecodeTPS, t.alpha)
	}
	s.Updated = now
	next := maps.Clone(cur)
	next[worker] = &s
	t.stats.Store(&next)
	t.dirty[worker] = true
}

// Get returns worker's stats; the zero WorkerStats when none are known.
func (t *Tracker) Get(worker string) WorkerStats {
	if s := t.Stats(worker); s != nil {
		return *s
	}
	return WorkerStats{}
}

// Stats returns worker's current stats without copying them, or nil. The
// value is immutable: later observations replace it, never change it.
func (t *Tracker) Stats(worker string) *WorkerStats {
	return (*t.stats.Load())[worker]
}

// All returns a copy of every worker's stats.
func (t *Tracker) All() map[string]WorkerStats {
	cur := *t.stats.Load()
	out := make(map[string]WorkerStats, len(cur))
	for name, s := range cur {
		out[name] = *s
	}
	return out
}

// Flush writes the entries changed since the last flush to the store. On
// failure the entries stay dirty and are retried by the next flush.
func (t *Tracker) Flush(ctx context.Context) error {
	if t.store == nil {
		return nil
	}
	t.mu.Lock()
	batch := make(map[string]WorkerStats, len(t.dirty))
	for name := range t.dirty {
		batch[name] = *(*t.stats.Load())[name]
	}
	clear(t.dirty)
	t.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	if err := t.store.Save(ctx, batch); err != nil {
		t.mu.Lock()
		for name := range batch {
			t.dirty[name] = true
		}
		t.mu.Unlock()
		return fmt.Errorf("stats: save: %w", err)
	}
	return nil
}

// Run flushes every interval until ctx ends, then flushes once more so a
// clean shutdown loses nothing.
func (t *Tracker) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := t.Flush(context.WithoutCancel(ctx)); err != nil {
				t.log.Error("final stats flush failed", "err", err)
			}
			return
		case <-tick.C:
			if err := t.Flush(ctx); err != nil {
				t.log.Warn("stats flush failed", "err", err)
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
