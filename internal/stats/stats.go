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
//
// A Tracker holds the workers of the fleet, not every name its store was
// ever given (Kubernetes names workers after pods, so a store gains names
// with every rollout): Track loads a worker's stored averages when it
// joins, an observation of a worker not yet held starts its entry, and
// Forget drops the entry when the worker has left, after which the next
// flush still writes what it observed. The store keeps a forgotten
// worker's averages, so one that comes back under its name, after a
// restart too, is still known slow.
//
// A store that several router replicas share (RedisStore) is a Folder: the
// Tracker sends it the observations themselves, which it folds in
// atomically, and reloads it every flush interval, so each replica's
// averages include every replica's samples, and an unreachable store only
// delays that — the local averages keep every sample meanwhile.
//
// A worker's stats also carry package predict's fitted latency model
// (Fit), set whole by SetFit and persisted with the averages. Fits are
// not folded: each replica keeps its own, a shared store holds the last
// one flushed, and a replica that starts adopts it.
package stats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Alpha is the router's smoothing factor: each new sample moves an
// average by this share of its gap to the sample.
const Alpha = 0.2

// FlushInterval is how often a router writes the changed averages to its
// store (and reloads a shared one).
const FlushInterval = time.Second

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
	// Levels holds what streams achieved at each concurrency level:
	// Levels[k-1] is for streams that shared the worker with k-1 others
	// on average (Sluice's own in-flight count). The adaptive concurrency
	// limit is learned from them; being persisted with the rest, a worker
	// known to slow down at 3 streams is still known to after a restart.
	Levels Levels `json:"levels,omitzero"`
	// Fit is the latency model package predict fitted to this worker's
	// finished requests (nil: none yet, or a stats file older than it),
	// kept here so that it survives a restart with the averages.
	Fit *Fit `json:"fit,omitempty"`
	// Updated is when the stats last changed.
	Updated time.Time `json:"updated"`
}

// Fit is the state of package predict's model of one worker, persisted
// with its averages. Its meaning belongs to package predict; stats only
// keeps it, replaces it whole (SetFit) and never changes it in place, so a
// *Fit, once published, is immutable like the rest of WorkerStats.
type Fit struct {
	// Theta are the coefficients of the TTFT regression and P the
	// inverse of its weighted information matrix, row-major
	// (len(Theta)² values): together, the state of the recursive least
	// squares that fits them.
	Theta []float64 `json:"theta,omitempty"`
	P     []float64 `json:"p,omitempty"`
	// Samples counts the outcomes the regression has seen.
	Samples int64 `json:"samples,omitempty"`
	// TTFTDrift and DecodeDrift are fast moving averages of the log of
	// actual over modelled TTFT and decode rate: how far the card has
	// drifted from its fitted curves lately.
	TTFTDrift   EMA `json:"ttft_drift"`
	DecodeDrift EMA `json:"decode_drift"`
	// HoldMs is how long a stream holds a slot (first token to last), in
	// milliseconds; WaitScale the measured in-worker wait over the one
	// predicted from it.
	HoldMs    EMA `json:"hold_ms"`
	WaitScale EMA `json:"wait_scale"`
	// TTFTErrs and DecodeErrs are the relative errors
	// |predicted − actual| / actual of the latest predictions recorded
	// against outcomes, oldest first, from which trust is judged.
	TTFTErrs   []float64 `json:"ttft_errs,omitempty"`
	DecodeErrs []float64 `json:"decode_errs,omitempty"`
	// Updated is when the fit last changed.
	Updated time.Time `json:"updated"`
}

// MaxLevels bounds the concurrency levels tracked per worker.
const MaxLevels = 256

// Level is what streams achieved at one concurrency level.
type Level struct {
	// DecodeTPS is the per-stream decode rate.
	DecodeTPS EMA `json:"decode_tps"`
	// DecodeSq is the moving average of the squared rate, so that
	// DecodeTPS and DecodeSq give the rate's spread.
	DecodeSq EMA `json:"decode_sq"`
	// TTFTMs is the time to first token.
	TTFTMs EMA `json:"ttft_ms"`
	// Updated is when a stream last reported at this level.
	Updated time.Time `json:"updated"`
}

// StdDev returns the standard deviation of the level's decode rate.
func (l Level) StdDev() float64 {
	if l.DecodeTPS.N < 2 {
		return 0
	}
	v := l.DecodeSq.Value - l.DecodeTPS.Value*l.DecodeTPS.Value
	if v <= 0 {
		return 0
	}
	return math.Sqrt(v)
}

// Level returns the stats of concurrency level k (1-based), or the zero
// Level when none are known.
func (s *WorkerStats) Level(k int) Level {
	return s.Levels.At(k)
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
	// Concurrency is the mean number of requests Sluice had in flight on
	// the worker while this one ran (itself included); 0 if unknown.
	Concurrency float64
	// CachedTokens is how many of the prompt's tokens the worker said it
	// found in its prefix cache (usage.prompt_tokens_details.cached_tokens,
	// llama.cpp's timings.cache_n), when CachedKnown.
	CachedTokens int
	CachedKnown  bool
}

// LevelOf returns the concurrency level, 1 to MaxLevels, that a stream
// which shared its worker with concurrency streams on average (itself
// included) is filed under; 0 when concurrency is unknown (0).
func LevelOf(concurrency float64) int {
	if concurrency <= 0 {
		return 0
	}
	return min(max(int(math.Round(concurrency)), 1), MaxLevels)
}

// Store persists WorkerStats. A Store is either a Saver or a Folder.
type Store interface {
	// Load returns the stored entries of the named workers; a worker
	// with none is absent from the result.
	Load(ctx context.Context, workers []string) (map[string]WorkerStats, error)
	// Close releases the store.
	Close() error
}

// Saver is a Store of one Tracker, which writes its averages whole.
type Saver interface {
	Store
	// Save writes the given entries, replacing older values, atomically:
	// after a crash the store holds either the old or the new value of
	// each entry, never a torn one.
	Save(ctx context.Context, entries map[string]WorkerStats) error
}

// Folder is a Store shared by several Trackers (one per router replica)
// that folds observations into the stored averages itself, atomically, so
// that concurrent replicas lose no sample. A Tracker whose store is a
// Folder sends it the observations made since the last flush instead of
// its own averages, adopts the averages Fold returns, and reloads the
// store every flush interval to pick up the other replicas' samples.
type Folder interface {
	Store
	// Fold folds each worker's observations, in order, into its stored
	// averages with smoothing factor alpha and returns the new averages
	// of every worker it folded. A worker absent from the result was not
	// folded (the error says why); its observations are sent again.
	Fold(ctx context.Context, alpha float64, batch map[string]FoldBatch) (map[string]WorkerStats, error)
	// SaveFits replaces each worker's stored fit: fits are not folded.
	SaveFits(ctx context.Context, fits map[string]*Fit) error
}

// FoldBatch is one worker's observations since the last flush.
type FoldBatch struct {
	Obs []Observation
	// Updated is when the latest of them was made.
	Updated time.Time
}

// maxPending bounds the observations kept per worker while a Folder is
// unreachable; older ones are dropped first (and counted) so a long outage
// cannot exhaust memory. The local averages still include them.
const maxPending = 4096

// Tracker owns the moving averages of every worker.
type Tracker struct {
	alpha  float64
	store  Store
	saver  Saver  // store, when it saves
	folder Folder // store, when it folds; then pending replaces dirty
	log    *slog.Logger

	mu sync.Mutex // serialises writers
	// stats maps each worker to the cell holding its current immutable
	// value. Observe replaces a cell's value; only a worker seen for the
	// first time copies the map (copy-on-write), so the scheduler reads
	// every worker's stats on each pick without a lock, and an
	// observation costs the same with 8 workers or 1,000.
	stats atomic.Pointer[map[string]*cell]
	dirty map[string]bool

	pending map[string]*FoldBatch // observations not yet folded into folder
	fits    map[string]*Fit       // fits set since the last flush, for folder
	dropped int64                 // pending observations dropped since the last flush
	// parting holds the last stats of forgotten workers whose changes
	// the store has not taken yet, for the next flush (and for Track,
	// should the worker come back before it).
	parting map[string]*WorkerStats
}

// cell holds one worker's current stats.
type cell struct{ p atomic.Pointer[WorkerStats] }

func newCell(ws WorkerStats) *cell {
	c := &cell{}
	c.p.Store(&ws)
	return c
}

// NewTracker returns a Tracker smoothing with alpha, persisting to store
// (nil: memory only). It holds no worker yet: Track loads one's stored
// averages.
func NewTracker(alpha float64, store Store, log *slog.Logger) (*Tracker, error) {
	if alpha <= 0 || alpha > 1 {
		return nil, fmt.Errorf("stats: alpha %v outside (0, 1]", alpha)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{alpha: alpha, store: store, log: log, dirty: map[string]bool{}, pending: map[string]*FoldBatch{},
		fits: map[string]*Fit{}, parting: map[string]*WorkerStats{}}
	switch st := store.(type) {
	case Folder:
		t.folder = st
	case Saver:
		t.saver = st
	case nil:
	default:
		return nil, fmt.Errorf("stats: a %T store neither saves nor folds", store)
	}
	m := map[string]*cell{}
	t.stats.Store(&m)
	return t, nil
}

// Track makes worker, which joins the fleet, held: with the averages in
// memory if it is held already, else those of its last life not yet
// written, else the store's (none: it starts without history). Call it
// before the worker serves a request: an observation made while the
// store is read wins over the stored averages. An error (the store did not
// answer) leaves it held without history; with a shared store, Refresh
// adopts the stored averages once the store answers.
func (t *Tracker) Track(ctx context.Context, worker string) error {
	t.mu.Lock()
	if t.heldLocked(worker) {
		t.mu.Unlock()
		return nil
	}
	t.mu.Unlock()
	var ws WorkerStats
	var err error
	if t.store != nil {
		var loaded map[string]WorkerStats
		if loaded, err = t.store.Load(ctx, []string{worker}); err != nil {
			err = fmt.Errorf("stats: load %q: %w", worker, err)
		}
		ws = loaded[worker]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.heldLocked(worker) {
		t.setLocked(*t.stats.Load(), nil, worker, &ws)
	}
	return err
}

// heldLocked reports whether worker is held, bringing it back from parting
// if it was forgotten with changes not yet written. t.mu must be held.
func (t *Tracker) heldLocked(worker string) bool {
	cur := *t.stats.Load()
	if cur[worker] != nil {
		return true
	}
	ws := t.parting[worker]
	if ws == nil {
		return false
	}
	delete(t.parting, worker)
	t.setLocked(cur, nil, worker, ws)
	return true
}

// Forget drops worker, which has left the fleet, from memory. What it
// observed since the last flush is still written by the next one; the
// store keeps its averages.
func (t *Tracker) Forget(worker string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.stats.Load()
	c := cur[worker]
	if c == nil {
		return
	}
	if t.unsavedLocked(worker) {
		t.parting[worker] = c.p.Load()
	}
	next := maps.Clone(cur)
	delete(next, worker)
	t.stats.Store(&next)
}

// unsavedLocked reports whether worker has changes the store has not
// taken. t.mu must be held.
func (t *Tracker) unsavedLocked(worker string) bool {
	return t.dirty[worker] || t.pending[worker] != nil || t.fits[worker] != nil
}

// settleLocked drops the parting workers whose changes the store has
// taken. t.mu must be held.
func (t *Tracker) settleLocked() {
	for name := range t.parting {
		if !t.unsavedLocked(name) {
			delete(t.parting, name)
		}
	}
}

// Observe folds one finished request on worker into its averages.
func (t *Tracker) Observe(worker string, o Observation, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.updateLocked(worker, func(s *WorkerStats) { *s = t.fold(*s, o, now) })
	if t.folder == nil {
		t.dirty[worker] = true
		return
	}
	p := t.pending[worker]
	if p == nil {
		p = &FoldBatch{}
		t.pending[worker] = p
	}
	p.Obs = append(p.Obs, o)
	p.Updated = now
	t.trimLocked(p)
}

// trimLocked keeps the newest maxPending of p's observations, counting
// those it drops. t.mu must be held.
func (t *Tracker) trimLocked(p *FoldBatch) {
	if n := len(p.Obs) - maxPending; n > 0 {
		p.Obs = p.Obs[n:]
		t.dropped += int64(n)
	}
}

// updateLocked publishes a copy of worker's stats (zero when it has none)
// changed by change. t.mu must be held.
func (t *Tracker) updateLocked(worker string, change func(*WorkerStats)) {
	var s WorkerStats
	cur := *t.stats.Load()
	c := cur[worker]
	if c == nil && t.heldLocked(worker) { // back from parting
		cur = *t.stats.Load()
		c = cur[worker]
	}
	if c != nil {
		s = *c.p.Load()
	}
	change(&s)
	t.setLocked(cur, c, worker, &s)
}

// setLocked publishes s as worker's stats; only a worker seen for the
// first time copies the map. t.mu must be held.
func (t *Tracker) setLocked(cur map[string]*cell, c *cell, worker string, s *WorkerStats) {
	if c != nil {
		c.p.Store(s)
		return
	}
	next := maps.Clone(cur)
	next[worker] = newCell(*s)
	t.stats.Store(&next)
}

// fold returns s with o folded in, as of now.
func (t *Tracker) fold(s WorkerStats, o Observation, now time.Time) WorkerStats {
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
	if k := LevelOf(o.Concurrency); k > 0 && (o.DecodeTPS > 0 || o.TTFT > 0) {
		// With leaves the old value as it was: it stays immutable.
		s.Levels = s.Levels.With(k, func(l *Level) {
			if o.DecodeTPS > 0 {
				l.DecodeTPS = l.DecodeTPS.Add(o.DecodeTPS, t.alpha)
				l.DecodeSq = l.DecodeSq.Add(o.DecodeTPS*o.DecodeTPS, t.alpha)
			}
			if o.TTFT > 0 {
				l.TTFTMs = l.TTFTMs.Add(ms(o.TTFT), t.alpha)
			}
			l.Updated = now
		})
	}
	s.Updated = now
	return s
}

// SetFit replaces worker's fitted latency model by f, which the caller
// must not change afterwards, and marks the worker for the next flush.
// A fit is not folded: with a shared store (a Folder) each replica keeps
// its own, adopting the shared averages keeps it, and the next flush
// writes it over the stored one (the last replica to flush wins; a
// replica starting adopts the stored fit).
func (t *Tracker) SetFit(worker string, f *Fit, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.updateLocked(worker, func(s *WorkerStats) { s.Fit, s.Updated = f, now })
	if t.folder == nil {
		t.dirty[worker] = true
		return
	}
	t.fits[worker] = f
}

// adoptLocked replaces worker's stats in next, a copy of the held map,
// by ws, read from the store, with the observations of p (none when nil)
// that the store has not taken yet folded on top. The local fit, when
// there is one, stays: this replica's fit is its freshest; the stored one
// is only a starting point. A worker not in next (forgotten meanwhile) is
// left out. t.mu must be held.
func (t *Tracker) adoptLocked(next map[string]*cell, worker string, ws WorkerStats, p *FoldBatch) {
	old := next[worker]
	if old == nil {
		return
	}
	if p != nil {
		for _, o := range p.Obs {
			ws = t.fold(ws, o, p.Updated)
		}
	}
	if f := old.p.Load().Fit; f != nil {
		ws.Fit = f
	}
	next[worker] = newCell(ws)
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
	if c := (*t.stats.Load())[worker]; c != nil {
		return c.p.Load()
	}
	return nil
}

// Handle remembers where one worker's stats live in a Tracker, so that a
// reader asking on every routing decision skips the map lookup for as
// long as the tracker's set of entries is unchanged (it changes when a
// worker is seen for the first time, and on Refresh and folds). The zero
// Handle is ready to use; a Handle is not safe for concurrent use.
type Handle struct {
	m *map[string]*cell // the map c was found in
	c *cell             // nil: worker had no entry in m
}

// StatsVia returns what Stats(worker) returns, through h, which must be
// used for this worker only.
func (t *Tracker) StatsVia(h *Handle, worker string) *WorkerStats {
	if m := t.stats.Load(); m != h.m {
		h.m, h.c = m, (*m)[worker]
	}
	if h.c == nil {
		return nil
	}
	return h.c.p.Load()
}

// All returns a copy of every worker's stats.
func (t *Tracker) All() map[string]WorkerStats {
	cur := *t.stats.Load()
	out := make(map[string]WorkerStats, len(cur))
	for name, c := range cur {
		out[name] = *c.p.Load()
	}
	return out
}

// Flush writes the entries changed since the last flush to the store. On
// failure the entries stay dirty and are retried by the next flush.
func (t *Tracker) Flush(ctx context.Context) error {
	if t.store == nil {
		return nil
	}
	if t.folder != nil {
		return t.flushFolds(ctx)
	}
	t.mu.Lock()
	cur := *t.stats.Load()
	batch := make(map[string]WorkerStats, len(t.dirty))
	for name := range t.dirty {
		if c := cur[name]; c != nil {
			batch[name] = *c.p.Load()
		} else {
			batch[name] = *t.parting[name] // forgotten since it changed
		}
	}
	clear(t.dirty)
	t.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := t.saver.Save(ctx, batch)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		for name := range batch {
			t.dirty[name] = true
		}
		return fmt.Errorf("stats: save: %w", err)
	}
	t.settleLocked()
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
			if t.folder != nil {
				if err := t.Refresh(ctx); err != nil {
					t.log.Warn("stats refresh from the shared store failed", "err", err)
				}
			}
		}
	}
}

// flushFolds sends the pending observations to the Folder and adopts the
// shared averages it returns, with whatever was observed meanwhile folded
// on top locally. Observations of a worker whose fold failed go back to
// the front of its pending list.
func (t *Tracker) flushFolds(ctx context.Context) error {
	t.mu.Lock()
	batch := make(map[string]FoldBatch, len(t.pending))
	for name, p := range t.pending {
		batch[name] = *p
	}
	clear(t.pending)
	dropped := t.dropped
	t.dropped = 0
	fits := t.fits
	t.fits = map[string]*Fit{}
	t.mu.Unlock()
	var fitErr error
	if len(fits) > 0 {
		if fitErr = t.folder.SaveFits(ctx, fits); fitErr != nil {
			t.mu.Lock()
			for name, f := range fits {
				if _, newer := t.fits[name]; !newer {
					t.fits[name] = f
				}
			}
			t.mu.Unlock()
			fitErr = fmt.Errorf("stats: save fits: %w", fitErr)
		}
	}
	if dropped > 0 {
		t.log.Error("shared stats store unreachable for long: dropped observations it will never see", "dropped", dropped)
	}
	var folded map[string]WorkerStats
	var err error
	if len(batch) > 0 {
		folded, err = t.folder.Fold(ctx, t.alpha, batch)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.settleLocked() // runs first, under the lock
	if len(batch) == 0 {
		return fitErr
	}
	next := maps.Clone(*t.stats.Load())
	for name, b := range batch {
		later := t.pending[name] // observed while Fold ran
		ws, ok := folded[name]
		if !ok {
			merged := &FoldBatch{Obs: b.Obs, Updated: b.Updated}
			if later != nil {
				merged.Obs = append(merged.Obs, later.Obs...)
				merged.Updated = later.Updated
			}
			t.trimLocked(merged)
			t.pending[name] = merged
			continue
		}
		t.adoptLocked(next, name, ws, later) // a forgotten worker's observations are in the store now
	}
	t.stats.Store(&next)
	if err != nil {
		return errors.Join(fmt.Errorf("stats: fold: %w", err), fitErr)
	}
	return fitErr
}

// Refresh replaces the local averages of the workers held by the store's,
// which other replicas sharing it also update, with the observations not
// yet sent folded on top. Workers the store does not know keep their local
// averages; workers only the store knows are not loaded.
func (t *Tracker) Refresh(ctx context.Context) error {
	if t.store == nil {
		return nil
	}
	names := slices.Collect(maps.Keys(*t.stats.Load()))
	if len(names) == 0 {
		return nil
	}
	loaded, err := t.store.Load(ctx, names)
	if err != nil {
		return fmt.Errorf("stats: refresh: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := maps.Clone(*t.stats.Load())
	for name, ws := range loaded {
		t.adoptLocked(next, name, ws, t.pending[name])
	}
	t.stats.Store(&next)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
