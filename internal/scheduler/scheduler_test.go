package scheduler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/stats"
)

// fakeStats is a StatsReader backed by a map.
type fakeStats map[string]stats.WorkerStats

func (f fakeStats) Stats(w string) *stats.WorkerStats {
	if s, ok := f[w]; ok {
		return &s
	}
	return nil
}

// mutableSource is a Source a test can change.
type mutableSource struct{ p atomic.Pointer[Snapshot] }

func newSource(s Snapshot) *mutableSource {
	m := &mutableSource{}
	m.p.Store(&s)
	return m
}
func (m *mutableSource) Snapshot() *Snapshot { return m.p.Load() }
func (m *mutableSource) Set(s Snapshot)      { m.p.Store(&s) }

func workers(n, limit int, model string) []WorkerSpec {
	out := make([]WorkerSpec, n)
	for i := range out {
		out[i] = WorkerSpec{Name: fmt.Sprintf("w%d", i), Models: []string{model}, MaxConcurrency: limit}
	}
	return out
}

func newSched(t testing.TB, cfg Config, ws ...WorkerSpec) *Scheduler {
	t.Helper()
	if reflect.ValueOf(cfg.Weights).IsZero() {
		cfg.Weights = DefaultWeights()
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = time.Minute
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "t"
	}
	if l := cfg.Limits; !l.Fixed && l.MinSamples == 0 && l.MinStreamTokS == 0 && l.FloorFraction == 0 && l.ModelFloors == nil {
		// Tests of scoring and queueing hold each worker's limit at its
		// max_concurrency; those of the controller (limit_test.go)
		// configure it.
		cfg.Limits.Fixed = true
	}
	s, err := New(cfg, ws...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScheduler_BurstLandsOnePerIdleWorker(t *testing.T) {
	for _, limit := range []int{1, 4} {
		t.Run(fmt.Sprintf("limit%d", limit), func(t *testing.T) {
			for round := range 200 {
				s := newSched(t, Config{MaxQueue: 10}, workers(4, limit, "m")...)
				start := make(chan struct{})
				var wg sync.WaitGroup
				got := make([]string, 4)
				for i := range 4 {
					wg.Go(func() {
						<-start
						l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 10})
						if err != nil {
							t.Error(err)
							return
						}
						got[i] = l.Worker
					})
				}
				close(start)
				wg.Wait()
				slices.Sort(got)
				if want := []string{"w0", "w1", "w2", "w3"}; !slices.Equal(got, want) {
					t.Fatalf("round %d: workers %v, want one per worker %v", round, got, want)
				}
			}
		})
	}
}

func TestScheduler_QueueIsFIFOAndNeverOverloads(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, workers(1, 1, "m")...)
	var order []int
	var mu sync.Mutex
	tickets := make([]*Ticket, 6)
	for i := range tickets {
		tickets[i] = s.Submit(Request{Model: "m"}, func(t *Ticket) {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
	}
	if got, want := s.QueueDepth("m"), 5; got != want {
		t.Fatalf("queue depth %d, want %d", got, want)
	}
	for i := range tickets {
		l, err := tickets[i].Result()
		if err != nil {
			t.Fatalf("ticket %d: %v", i, err)
		}
		if got := s.Workers()[0].Active; got != 1 {
			t.Fatalf("active %d with ticket %d bound, want exactly 1", got, i)
		}
		if i+1 < len(tickets) && tickets[i+1].Done() {
			t.Fatalf("ticket %d bound before %d released", i+1, i)
		}
		l.Release()
		l.Release() // idempotent
	}
	if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
		t.Fatalf("bind order %v, want %v", order, want)
	}
	if got := s.Workers()[0].Active; got != 0 {
		t.Fatalf("active %d after all released", got)
	}
}

func TestScheduler_LateBindingPicksWhicheverFreesFirst(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, workers(3, 1, "m")...)
	var leases []*Lease
	for range 3 {
		l, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	waiting := s.Submit(Request{Model: "m"}, nil)
	if waiting.Done() {
		t.Fatal("fourth request bound while every worker was full")
	}
	leases[2].Release() // w2 frees first
	l, err := waiting.Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Worker, "w2"; got != want {
		t.Fatalf("bound to %s, want %s (the worker that freed)", got, want)
	}
}

func TestScheduler_QueueFull(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 2}, workers(1, 1, "m")...)
	for range 3 {
		s.Submit(Request{Model: "m"}, nil)
	}
	_, err := s.Submit(Request{Model: "m"}, nil).Result()
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err %v, want queue full refusal", err)
	}
	if r.Reason != "queue_full" || r.RetryAfter < time.Second || r.DecisionID == "" {
		t.Fatalf("refusal %+v: want reason queue_full, retry-after >= 1s, a decision id", r)
	}
}

func TestScheduler_RetryAfterFollowsDrainRate(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := newSched(t, Config{MaxQueue: 3, Clock: clock, QueueTimeout: time.Hour}, workers(1, 1, "m")...)
	teachDrainRate(t, s, clock) // two left waiting
	s.Submit(Request{Model: "m"}, nil)
	_, err := s.Submit(Request{Model: "m"}, nil).Result()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("err %v, want refusal", err)
	}
	// 3 waiting + this one, 256 expected tokens each, at 64 tokens/s.
	if got, want := r.RetryAfter, 16*time.Second; got != want {
		t.Fatalf("retry-after %v, want %v", got, want)
	}
}

// teachDrainRate runs a backlog on s's one worker that drains a request of
// 256 expected tokens every 4 s (64 tokens/s), and returns the lease that
// holds the worker and the two requests left queued.
func teachDrainRate(t *testing.T, s *Scheduler, clock *fakeClock) (*Lease, []*Ticket) {
	t.Helper()
	l, err := s.Submit(Request{Model: "m"}, nil).Result()
	if err != nil {
		t.Fatal(err)
	}
	queued := []*Ticket{s.Submit(Request{Model: "m"}, nil), s.Submit(Request{Model: "m"}, nil)}
	for range 4 {
		clock.t = clock.t.Add(4 * time.Second)
		l.Release()
		if l, err = queued[0].Result(); err != nil || l == nil {
			t.Fatalf("queued request not bound on release: %v", err)
		}
		queued = append(queued[1:], s.Submit(Request{Model: "m"}, nil))
	}
	return l, queued
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time               { return c.t }
func (c *fakeClock) NewTimer(time.Duration) Timer { return WallClock{}.NewTimer(time.Hour) }

// fixedClock is a Clock stopped at one instant.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time               { return c.t }
func (c fixedClock) NewTimer(time.Duration) Timer { return WallClock{}.NewTimer(time.Hour) }

func TestScheduler_QueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSched(t, Config{MaxQueue: 5, QueueTimeout: 30 * time.Second}, workers(1, 1, "m")...)
		held, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = s.Admit(context.Background(), Request{Model: "m"})
		if !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("err %v, want queue timeout", err)
		}
		if got := time.Since(start); got != 30*time.Second {
			t.Fatalf("refused after %v, want 30s", got)
		}
		if got := s.QueueDepth("m"); got != 0 {
			t.Fatalf("queue depth %d after timeout", got)
		}
		held.Release()
	})
}

func TestScheduler_ClientGoneLeavesQueueAndFreesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSched(t, Config{MaxQueue: 5}, workers(1, 1, "m")...)
		held, _ := s.Admit(context.Background(), Request{Model: "m"})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() {
			_, err := s.Admit(ctx, Request{Model: "m"})
			errc <- err
		}()
		synctest.Wait()
		if got := s.QueueDepth("m"); got != 1 {
			t.Fatalf("queue depth %d, want 1", got)
		}
		cancel()
		if err := <-errc; !errors.Is(err, ErrClientGone) {
			t.Fatalf("err %v, want client gone", err)
		}
		if got := s.QueueDepth("m"); got != 0 {
			t.Fatalf("queue depth %d after disconnect", got)
		}
		if got := s.Workers()[0].Active; got != 1 {
			t.Fatalf("active %d, want 1: the disconnect must not free the held slot", got)
		}
		held.Release()
	})
}

func TestScheduler_Refusals(t *testing.T) {
	down := newSource(Snapshot{Health: HealthDown, HealthReason: "connection refused"})
	loading := newSource(Snapshot{Health: HealthLoading})
	tests := []struct {
		name    string
		workers []WorkerSpec
		req     Request
		want    error // nil: queued
	}{
		{"unknown model", workers(2, 1, "m"), Request{Model: "other"}, ErrUnknownModel},
		{"all down", []WorkerSpec{{Name: "a", Models: []string{"m"}, Source: down}}, Request{Model: "m"}, ErrNoHealthyWorker},
		{"all excluded", workers(1, 1, "m"), Request{Model: "m", Exclude: []string{"w0"}, Attempt: 2}, ErrNoHealthyWorker},
		{"loading waits", []WorkerSpec{{Name: "a", Models: []string{"m"}, Source: loading}}, Request{Model: "m"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSched(t, Config{MaxQueue: 5}, tt.workers...)
			tk := s.Submit(tt.req, nil)
			if tt.want == nil {
				if tk.Done() {
					t.Fatalf("ticket ended: %v", tk.err)
				}
				return
			}
			if _, err := tk.Result(); !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
		})
	}
}

func TestScheduler_LoadedWorkerTakesQueuedRequestOnKick(t *testing.T) {
	src := newSource(Snapshot{Health: HealthLoading})
	s := newSched(t, Config{MaxQueue: 5}, WorkerSpec{Name: "a", Models: []string{"m"}, Source: src})
	tk := s.Submit(Request{Model: "m"}, nil)
	src.Set(Snapshot{Health: HealthOK})
	s.Kick()
	if l, err := tk.Result(); err != nil || l.Worker != "a" {
		t.Fatalf("after load: lease %v err %v", l, err)
	}
}

func TestScheduler_WaitsForModelDiscovery(t *testing.T) {
	src := newSource(Snapshot{}) // models not discovered yet
	s := newSched(t, Config{MaxQueue: 5}, WorkerSpec{Name: "a", Source: src})
	served := s.Submit(Request{Model: "m"}, nil)
	unserved := s.Submit(Request{Model: "other"}, nil)
	if served.Done() || unserved.Done() {
		t.Fatal("refused before the worker's models were known")
	}
	src.Set(Snapshot{Models: []string{"m"}})
	s.Kick()
	if l, err := served.Result(); err != nil || l.Worker != "a" {
		t.Fatalf("served model: %v %v", l, err)
	}
	if _, err := unserved.Result(); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unserved model: %v, want unknown model once models are known", err)
	}
}

func TestScheduler_RetryExcludesFailedWorkerAndGoesFirst(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 5}, workers(2, 1, "m")...)
	first, _ := s.Admit(context.Background(), Request{Model: "m"})  // w0
	second, _ := s.Admit(context.Background(), Request{Model: "m"}) // w1
	waiting := s.Submit(Request{Model: "m"}, nil)
	// first fails on w0 before any byte: release and retry elsewhere.
	retry := s.Submit(Request{Model: "m", Exclude: []string{first.Worker}, Attempt: 2}, nil)
	first.Release() // w0 frees: waiting may take it, the retry may not.
	if l, err := waiting.Result(); err != nil || l.Worker != "w0" {
		t.Fatalf("waiting: %v %v, want w0", l, err)
	}
	if retry.Done() {
		t.Fatal("retry bound to the worker that failed it")
	}
	second.Release()
	if l, err := retry.Result(); err != nil || l.Worker != "w1" {
		t.Fatalf("retry: %v %v, want w1", l, err)
	}
}

func TestScheduler_ScoreTerms(t *testing.T) {
	tests := []struct {
		name  string
		snaps map[string]Snapshot
		stats fakeStats
		want  string
	}{
		{"kv pressure", map[string]Snapshot{"w0": {KVPressure: Reading{Value: 0.9, At: time.Now()}}, "w1": {KVPressure: Reading{Value: 0.2, At: time.Now()}}}, nil, "w1"},
		{"gpu util", map[string]Snapshot{"w0": {GPUUtil: Reading{Value: 0.8, At: time.Now()}}, "w1": {GPUUtil: Reading{Value: 0.1, At: time.Now()}}}, nil, "w1"},
		{"worker queue", map[string]Snapshot{"w0": {QueueLen: Reading{Value: 2, At: time.Now()}}, "w1": {QueueLen: Reading{Value: 0, At: time.Now()}}}, nil, "w1"},
		{"throughput reward", nil, fakeStats{"w0": {DecodeTPS: stats.EMA{Value: 40, N: 5}}, "w1": {DecodeTPS: stats.EMA{Value: 80, N: 5}}}, "w1"},
		{"latency", nil, fakeStats{"w0": {TTFTMs: stats.EMA{Value: 900, N: 5}}, "w1": {TTFTMs: stats.EMA{Value: 100, N: 5}}}, "w1"},
		{"tie goes to first listed", nil, nil, "w0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ws []WorkerSpec
			for _, n := range []string{"w0", "w1"} {
				ws = append(ws, WorkerSpec{Name: n, Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(tt.snaps[n])})
			}
			s := newSched(t, Config{MaxQueue: 5, Stats: tt.stats}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != tt.want {
				t.Fatalf("picked %s, want %s; reason %q", l.Worker, tt.want, l.Decision.Reason)
			}
		})
	}
}

func TestScheduler_NeutralValueForNoHistory(t *testing.T) {
	st := fakeStats{"w0": {DecodeTPS: stats.EMA{Value: 50, N: 3}}, "w1": {DecodeTPS: stats.EMA{Value: 100, N: 3}}}
	s := newSched(t, Config{MaxQueue: 5, Stats: st}, workers(3, 1, "m")...)
	l, _ := s.Admit(context.Background(), Request{Model: "m"})
	norms := map[string]float64{}
	for _, c := range l.Decision.Explain().Candidates {
		for _, term := range c.Terms {
			if term.Name == "throughput" {
				norms[c.Worker] = term.Norm
				if c.Worker == "w2" && !term.Neutral {
					t.Error("w2 has no history but its term is not marked neutral")
				}
			}
		}
	}
	if got, want := norms["w2"], 0.75; got != want {
		t.Fatalf("no-history norm %v, want %v (mean of 0.5 and 1)", got, want)
	}
	if norms["w2"] <= norms["w0"] || norms["w2"] >= norms["w1"] {
		t.Fatalf("no-history norm %v not between worst %v and best %v", norms["w2"], norms["w0"], norms["w1"])
	}
}

func TestScheduler_DecisionRecordExplainsEveryWorker(t *testing.T) {
	var recs []*decisions.Record
	down := newSource(Snapshot{Health: HealthDown, HealthReason: "probe failed"})
	ws := []WorkerSpec{
		{Name: "a", Models: []string{"m"}, MaxConcurrency: 1},
		{Name: "b", Models: []string{"m"}, Source: down},
		{Name: "c", Models: []string{"x"}},
	}
	s := newSched(t, Config{MaxQueue: 5, Recorder: func(r *decisions.Record) { recs = append(recs, r) }}, ws...)
	l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 100, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0] != l.Decision {
		t.Fatalf("recorded %d records; want the lease's decision once", len(recs))
	}
	r := recs[0].Explain()
	if r.Chosen != "a" || r.Outcome != "bound" || len(r.Candidates) != 3 {
		t.Fatalf("record %+v", r)
	}
	if got := r.Candidates[1].Why; got != "unhealthy: probe failed" {
		t.Errorf("b why %q", got)
	}
	if got := r.Candidates[2].Why; got != `does not serve model "m"` {
		t.Errorf("c why %q", got)
	}
	if n := len(r.Candidates[0].Terms); n != 8 {
		t.Fatalf("chosen has %d terms, want 8", n)
	}
	sum := 0.0
	for _, term := range r.Candidates[0].Terms {
		if term.Weighted != term.Weight*term.Norm {
			t.Errorf("term %s weighted %v != weight %v * norm %v", term.Name, term.Weighted, term.Weight, term.Norm)
		}
		sum += term.Weighted
	}
	if sum != r.Candidates[0].Total {
		t.Errorf("terms sum %v != total %v", sum, r.Candidates[0].Total)
	}
	if got := s.Workers()[0].JobCost; got != 150 {
		t.Errorf("job cost %v, want prompt 100 + min(max_tokens 50, default 256)", got)
	}
}

func TestScheduler_StaleTelemetryIsMarked(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	src := newSource(Snapshot{KVPressure: Reading{Value: 0.5, Source: "test", At: clock.t.Add(-10 * time.Second)}})
	s := newSched(t, Config{MaxQueue: 5, Clock: clock, StaleAfter: 3 * time.Second}, WorkerSpec{Name: "a", Models: []string{"m"}, Source: src})
	l, _ := s.Admit(context.Background(), Request{Model: "m"})
	for _, term := range l.Decision.Explain().Candidates[0].Terms {
		if term.Name == "kv_pressure" {
			if !term.Stale || term.AgeMs != 10000 {
				t.Fatalf("kv term %+v, want stale with age 10000ms", term)
			}
			return
		}
	}
	t.Fatal("no kv_pressure term")
}

func TestScheduler_DrainAndRemove(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 5}, workers(2, 1, "m")...)
	if err := s.SetDraining("w0", true); err != nil {
		t.Fatal(err)
	}
	l, _ := s.Admit(context.Background(), Request{Model: "m"})
	if l.Worker != "w1" {
		t.Fatalf("picked %s while w0 drains", l.Worker)
	}
	if err := s.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	l.Release() // in-flight lease on a removed worker releases cleanly
	if _, err := s.Submit(Request{Model: "m"}, nil).Result(); !errors.Is(err, ErrNoHealthyWorker) {
		t.Fatalf("err %v, want no healthy worker (only a draining one left)", err)
	}
}

func TestScheduler_BaselinePolicies(t *testing.T) {
	leases := map[string]*Lease{}
	pick := func(s *Scheduler) string {
		l, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		leases[l.Worker] = l
		return l.Worker
	}
	t.Run("round-robin ignores limits and cycles", func(t *testing.T) {
		s := newSched(t, Config{Policy: PolicyRoundRobin}, workers(3, 1, "m")...)
		var got []string
		for range 6 {
			got = append(got, pick(s))
		}
		if want := []string{"w0", "w1", "w2", "w0", "w1", "w2"}; !slices.Equal(got, want) {
			t.Fatalf("got %v want %v", got, want)
		}
	})
	t.Run("least-connections", func(t *testing.T) {
		s := newSched(t, Config{Policy: PolicyLeastConnections}, workers(3, 1, "m")...)
		a, b, c := pick(s), pick(s), pick(s)
		if a == b || b == c || a == c {
			t.Fatalf("three picks %s %s %s on three idle workers", a, b, c)
		}
		leases[b].Release() // b finishes
		if got := pick(s); got != b {
			t.Fatalf("picked %s, want %s with fewest connections", got, b)
		}
	})
	for _, p := range []Policy{PolicyRandom, PolicyPowerOfTwo} {
		t.Run(string(p)+" is seeded", func(t *testing.T) {
			run := func() []string {
				s := newSched(t, Config{Policy: p, Seed: 7}, workers(4, 1, "m")...)
				var out []string
				for range 20 {
					out = append(out, pick(s))
				}
				return out
			}
			if a, b := run(), run(); !slices.Equal(a, b) {
				t.Fatalf("same seed gave %v and %v", a, b)
			}
		})
	}
}

// BenchmarkPick measures one admission at n idle workers — score every
// worker, reserve the winner, release — with the decision record built
// (as the router does) and without it (as virtual-time runs do).
// "default" is the router as shipped: learned limits (MinSamples 3 is
// the default, set only so newSched does not fix the limits), default
// weights, max_concurrency auto, and the prefix index asked about a
// prompt of eight blocks.
func BenchmarkPick(b *testing.B) {
	for _, mode := range []struct {
		records bool
		limits  LimitConfig
		def     bool // max_concurrency auto, a prefix index and hashes
		name    string
	}{
		{true, LimitConfig{Fixed: true}, false, "records=true"},
		{false, LimitConfig{Fixed: true}, false, "records=false"},
		{true, LimitConfig{MinSamples: 3}, false, "records=true/limits=auto"},
		{true, LimitConfig{MinSamples: 3}, true, "records=true/default"},
	} {
		records := mode.records
		for _, n := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("%s/workers=%d", mode.name, n), func(b *testing.B) {
				st, _ := stats.NewTracker(context.Background(), 0.2, nil, nil)
				limit := 1 << 30
				if mode.def {
					limit = 0
				}
				ws := workers(n, limit, "m")
				for i := range ws {
					ws[i].Source = newSource(Snapshot{Health: HealthOK, KVPressure: Reading{Value: float64(i%10) / 10, At: time.Now()}})
					st.Observe(ws[i].Name, stats.Observation{TTFT: time.Duration(100+i) * time.Millisecond, OutputTokens: 100, DecodeTPS: float64(50 + i%7)}, time.Now())
				}
				cfg := Config{MaxQueue: 5, Stats: st, NoRecords: !records, Limits: mode.limits}
				req := Request{Model: "m", PromptTokens: 100}
				if mode.def {
					cfg.PrefixIndex = prefix.NewIndex(prefix.Options{})
					req.Prefix = []uint64{1, 2, 3, 4, 5, 6, 7, 8}
				}
				s := newSched(b, cfg, ws...)
				b.ReportAllocs()
				for b.Loop() {
					l, err := s.Admit(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					l.Release()
				}
			})
		}
	}
}

// BenchmarkQueueWhileFull measures a request arriving when every worker is
// busy: it must queue without building a decision record nobody reads.
func BenchmarkQueueWhileFull(b *testing.B) {
	for _, n := range []int{64, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			s := newSched(b, Config{MaxQueue: 1 << 30}, workers(n, 1, "m")...) // never full: each iteration adds one
			for range n {
				s.Submit(Request{Model: "m"}, nil)
			}
			b.ReportAllocs()
			for b.Loop() {
				t := s.Submit(Request{Model: "m"}, nil)
				if t.Done() {
					b.Fatal("bound while every worker is full")
				}
			}
		})
	}
}

// BenchmarkQueueWhileFullPrefix is BenchmarkQueueWhileFull with what the
// default router has under a backlog: learned limits below each worker's
// cap, a prefix index and prompt hashes that miss everywhere, so that each
// arrival also looks behind the head for a request that could run one
// stream over a holder's learned limit (affinity.go), within its budget.
func BenchmarkQueueWhileFullPrefix(b *testing.B) {
	for _, n := range []int{64, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			now := time.Now()
			fs := fakeStats{}
			ws := workers(n, 4, "m")
			for _, w := range ws {
				fs[w.Name] = levels(now, [3]float64{80, 1, 5}, [3]float64{30, 1, 5}) // learned 1 of 4
			}
			s := newSched(b, Config{MaxQueue: 1 << 30, NoRecords: true, Stats: fs, PrefixIndex: prefix.NewIndex(prefix.Options{}),
				Limits: LimitConfig{MinStreamTokS: 50, MinSamples: 3}}, ws...)
			for i := range n + 64 {
				s.Submit(Request{Model: "m", Prefix: []uint64{uint64(i), 1, 2, 3}}, nil)
			}
			b.ReportAllocs()
			i := uint64(1 << 20)
			for b.Loop() {
				i++
				t := s.Submit(Request{Model: "m", Prefix: []uint64{i, 1, 2, 3}}, nil)
				if t.Done() {
					b.Fatal("bound while every worker is full")
				}
			}
		})
	}
}

func TestScheduler_NoRecordsPicksTheSame(t *testing.T) {
	run := func(noRecords bool) []string {
		st := fakeStats{"w1": {DecodeTPS: stats.EMA{Value: 80, N: 3}}, "w2": {TTFTMs: stats.EMA{Value: 900, N: 3}}}
		s := newSched(t, Config{MaxQueue: 100, Stats: st, NoRecords: noRecords}, workers(4, 2, "m")...)
		var got []string
		var held []*Lease
		for i := range 20 {
			tk := s.Submit(Request{Model: "m", PromptTokens: 10 * i}, nil)
			if l, err := tk.Result(); err == nil && l != nil {
				got = append(got, l.Worker)
				held = append(held, l)
				if (l.Decision == nil) != noRecords {
					t.Fatalf("noRecords=%v but lease decision %v", noRecords, l.Decision)
				}
			}
			if i%3 == 2 && len(held) > 0 {
				held[0].Release()
				held = held[1:]
			}
		}
		return got
	}
	if a, b := run(false), run(true); !slices.Equal(a, b) {
		t.Fatalf("with records %v, without %v", a, b)
	}
	if _, err := New(Config{NoRecords: true, Recorder: func(*decisions.Record) {}}); err == nil {
		t.Fatal("NoRecords with a Recorder accepted")
	}
}

// A worker that reports no telemetry (an openai-kind worker, a broken
// /metrics) must not look idle: it is neutral, between the best and the
// worst of those that report.
func TestScheduler_UnknownTelemetryIsNeutral(t *testing.T) {
	now := time.Now()
	for _, term := range []string{"kv_pressure", "gpu_util", "queue_length"} {
		t.Run(term, func(t *testing.T) {
			read := func(v float64) Snapshot {
				r := Reading{Value: v, At: now, Source: "test"}
				switch term {
				case "kv_pressure":
					return Snapshot{KVPressure: r}
				case "gpu_util":
					return Snapshot{GPUUtil: r}
				}
				r.Value *= 4
				return Snapshot{QueueLen: r}
			}
			ws := []WorkerSpec{
				{Name: "silent", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(Snapshot{})},
				{Name: "busy", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(read(0.9))},
				{Name: "quiet", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(read(0.1))},
			}
			s := newSched(t, Config{MaxQueue: 5, Clock: fixedClock{now}}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != "quiet" {
				t.Fatalf("picked %s, want quiet (the silent worker must not win on missing data)", l.Worker)
			}
			rec := l.Decision.Explain()
			ranks := map[string]int{}
			for _, c := range rec.Candidates {
				ranks[c.Worker] = c.Rank
				for _, tm := range c.Terms {
					if c.Worker == "silent" && tm.Name == term && !tm.Neutral {
						t.Errorf("silent worker's %s term not marked neutral: %+v", term, tm)
					}
				}
			}
			if got, want := ranks["silent"], 2; got != want {
				t.Fatalf("silent worker ranked %d, want %d (between quiet and busy): %v", got, want, ranks)
			}
		})
	}
}

// A reading that stopped being refreshed fades to neutral: a worker whose
// scrape broke while it looked idle must not keep winning on that reading.
func TestScheduler_StaleTelemetryLosesWeight(t *testing.T) {
	now := time.Now()
	kv := func(v float64, age time.Duration) *mutableSource {
		return newSource(Snapshot{KVPressure: Reading{Value: v, At: now.Add(-age), Source: "test"}})
	}
	tests := []struct {
		age  time.Duration
		want string
	}{
		{age: time.Second, want: "frozen"},     // fresh: its 0.0 wins
		{age: 20 * time.Second, want: "fresh"}, // past 3x stale_after: neutral (0.4) loses to 0.3
	}
	for _, tt := range tests {
		t.Run(tt.age.String(), func(t *testing.T) {
			ws := []WorkerSpec{
				{Name: "frozen", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0, tt.age)},
				{Name: "fresh", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0.3, 0)},
				{Name: "other", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0.5, 0)},
			}
			s := newSched(t, Config{MaxQueue: 5, StaleAfter: 3 * time.Second, Clock: fixedClock{now}}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != tt.want {
				t.Fatalf("picked %s, want %s", l.Worker, tt.want)
			}
		})
	}
}

// Admit's queue timeout runs on the injected clock, not the wall clock.
func TestScheduler_AdmitTimesOutOnInjectedClock(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	s := newSched(t, Config{MaxQueue: 5, QueueTimeout: 30 * time.Second, Clock: clk}, workers(1, 1, "m")...)
	held, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Admit(context.Background(), Request{Model: "m"})
		errc <- err
	}()
	clk.AwaitTimers(1) // the waiter is queued and has armed its timer
	clk.Advance(29 * time.Second)
	select {
	case err := <-errc:
		t.Fatalf("refused before the timeout: %v", err)
	default:
	}
	clk.Advance(time.Second)
	if err := <-errc; !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("err %v, want queue timeout", err)
	}
}

// Two routers started in the same millisecond must not hand out the same
// decision ids.
func TestScheduler_DecisionIDsDifferBetweenReplicasStartedTogether(t *testing.T) {
	clk := fixedClock{time.Unix(1700000000, 0)}
	a, err := New(Config{Clock: clk, QueueTimeout: time.Second}, workers(1, 1, "m")...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Clock: clk, QueueTimeout: time.Second}, workers(1, 1, "m")...)
	if err != nil {
		t.Fatal(err)
	}
	la, _ := a.Admit(context.Background(), Request{Model: "m"})
	lb, _ := b.Admit(context.Background(), Request{Model: "m"})
	if la == nil || lb == nil || la.Decision.ID == lb.Decision.ID {
		t.Fatalf("ids %v and %v: want two different ids", la, lb)
	}
}

// A prompt longer than a worker's context is not sent there; when no
// worker can hold it, the request is refused at once as too long.
func TestScheduler_PromptCheckedAgainstContext(t *testing.T) {
	small := newSource(Snapshot{Models: []string{"m"}, ContextTokens: 4096})
	large := newSource(Snapshot{Models: []string{"m"}, ContextTokens: 32768})
	s := newSched(t, Config{MaxQueue: 5},
		WorkerSpec{Name: "small", MaxConcurrency: 4, Source: small},
		WorkerSpec{Name: "large", MaxConcurrency: 4, Source: large})
	l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 8000})
	if err != nil || l.Worker != "large" {
		t.Fatalf("8,000-token prompt: %v %v, want the 32k worker", l, err)
	}
	rec := l.Decision.Explain()
	if why := rec.Candidates[0].Why; !strings.Contains(why, "exceeds its context of 4096") {
		t.Fatalf("small worker's reason %q", why)
	}
	l.Release()
	_, err = s.Admit(context.Background(), Request{Model: "m", PromptTokens: 40000})
	var ref *Refusal
	if !errors.As(err, &ref) || !errors.Is(err, ErrPromptTooLong) || ref.Reason != "context_length_exceeded" {
		t.Fatalf("40,000-token prompt: %v, want a context_length_exceeded refusal", err)
	}
}

// A record is built from what the pick kept, whenever it is read: read
// after the fleet has moved on, by several goroutines while the scheduler
// goes on picking (later records share the chunks of its slots that did
// not change), and after records made meanwhile were dropped, it says
// exactly what it says when read at once, and its Summary agrees with its
// candidates.
func TestScheduler_RecordReadLateSaysWhatItSaidAtOnce(t *testing.T) {
	run := func(t *testing.T, late bool) []string {
		clock := &fakeClock{t: time.Unix(1000, 0)}
		srcs := make([]*mutableSource, 6)
		ws := workers(len(srcs), 2, "m")
		for i := range srcs {
			srcs[i] = newSource(Snapshot{Health: HealthOK, KVPressure: Reading{Value: 0.1 * float64(i), Source: "test", At: clock.t}})
			ws[i].Source = srcs[i]
		}
		ws[4].Models = []string{"other"}
		st, _ := stats.NewTracker(context.Background(), 0.2, nil, nil)
		var mu sync.Mutex
		var recs []*decisions.Record
		var out []string
		marshal := func(r *decisions.Record) string {
			b, err := r.MarshalJSON()
			if err != nil {
				t.Error(err)
			}
			return string(b)
		}
		s := newSched(t, Config{MaxQueue: 1, Clock: clock, Stats: st, StaleAfter: time.Second, PrefixIndex: prefix.NewIndex(prefix.Options{}),
			Limits: LimitConfig{MinSamples: 3}, Recorder: func(r *decisions.Record) {
				mu.Lock()
				defer mu.Unlock()
				recs = append(recs, r)
				if !late {
					out = append(out, marshal(r))
				}
			}}, ws...)
		// Late readers explain records while the scheduler picks.
		stop := make(chan struct{})
		var readers sync.WaitGroup
		for range 3 {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					// The newest record, unless it is one kept to the end:
					// those are first read there.
					mu.Lock()
					var r *decisions.Record
					if n := len(recs); n > 0 && (n-1)%3 != 0 {
						r = recs[n-1]
					}
					mu.Unlock()
					if late && r != nil {
						_ = r.Summary.Score
						marshal(r)
					}
				}
			}()
		}
		var pending []*Ticket
		var held []*Lease
		for i := range 40 {
			clock.t = clock.t.Add(300 * time.Millisecond)
			srcs[i%len(srcs)].Set(Snapshot{Health: []Health{HealthOK, HealthDown}[i%7/6], HealthReason: "probe failed",
				KVPressure: Reading{Value: float64(i%5) / 5, Source: "test", At: clock.t}})
			pending = append(pending, s.Submit(Request{Model: "m", PromptTokens: 10 + i, Prefix: []uint64{uint64(i % 3), 7}}, nil))
			pending = slices.DeleteFunc(pending, func(tk *Ticket) bool {
				if !tk.Done() {
					return false
				}
				if l, err := tk.Result(); err == nil {
					held = append(held, l)
				}
				return true
			})
			if len(held) > 3 || (i%4 == 3 && len(held) > 0) {
				l := held[0]
				held = held[1:]
				st.Observe(l.Worker, stats.Observation{TTFT: time.Duration(100+i) * time.Millisecond, OutputTokens: 100, DecodeTPS: float64(40 + i%9)}, clock.t)
				l.Release()
			}
			if late {
				// Drop two records in three; the GC frees the chunks no
				// kept record shares.
				mu.Lock()
				for j := range recs {
					if j%3 != 0 {
						recs[j] = nil
					}
				}
				mu.Unlock()
				runtime.GC()
			}
		}
		close(stop)
		readers.Wait()
		for j, r := range recs {
			switch {
			case !late:
			case r == nil:
				out = append(out, "")
			default:
				out = append(out, marshal(r))
			}
			if r == nil {
				continue
			}
			sum := decisions.Summary{Candidates: len(r.Candidates)}
			for _, c := range r.Candidates {
				if c.Eligible {
					sum.Eligible++
				}
				if c.Worker == r.Chosen && r.Policy == string(PolicySluice) {
					sum.Score = c.Total
				}
			}
			if r.Summary != sum {
				t.Errorf("record %d: summary %+v, its candidates say %+v", j, r.Summary, sum)
			}
		}
		return out
	}
	atOnce, late := run(t, false), run(t, true)
	if len(atOnce) != 40 || len(late) != 40 {
		t.Fatalf("%d and %d records, want 40 each", len(atOnce), len(late))
	}
	for i := range atOnce {
		if late[i] != "" && atOnce[i] != late[i] {
			t.Fatalf("record %d read late:\n%s\nread at once:\n%s", i, late[i], atOnce[i])
		}
	}
}
