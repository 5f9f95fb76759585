package scheduler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/snapshot"
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
type mutableSource struct {
	p atomic.Pointer[snapshot.Snapshot]
}

func newSource(s snapshot.Snapshot) *mutableSource {
	m := &mutableSource{}
	m.p.Store(&s)
	return m
}
func (m *mutableSource) Snapshot() *snapshot.Snapshot { return m.p.Load() }
func (m *mutableSource) Set(s snapshot.Snapshot)      { m.p.Store(&s) }

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
	down := newSource(snapshot.Snapshot{Health: snapshot.HealthDown, HealthReason: "connection refused"})
	loading := newSource(snapshot.Snapshot{Health: snapshot.HealthLoading})
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
	src := newSource(snapshot.Snapshot{Health: snapshot.HealthLoading})
	s := newSched(t, Config{MaxQueue: 5}, WorkerSpec{Name: "a", Models: []string{"m"}, Source: src})
	tk := s.Submit(Request{Model: "m"}, nil)
	src.Set(snapshot.Snapshot{Health: snapshot.HealthOK})
	s.Kick()
	if l, err := tk.Result(); err != nil || l.Worker != "a" {
		t.Fatalf("after load: lease %v err %v", l, err)
	}
}

func TestScheduler_WaitsForModelDiscovery(t *testing.T) {
	src := newSource(snapshot.Snapshot{}) // models not discovered yet
	s := newSched(t, Config{MaxQueue: 5}, WorkerSpec{Name: "a", Source: src})
	served := s.Submit(Request{Model: "m"}, nil)
	unserved := s.Submit(Request{Model: "other"}, nil)
	if served.Done() || unserved.Done() {
		t.Fatal("refused before the worker's models were known")
	}
	src.Set(snapshot.Snapshot{Models: []string{"m"}})
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

// Admit's queue timeout runs on the injected clock, not the wall clock.
func TestScheduler_AdmitTimesOutOnInjectedClock(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(1000, 0))
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
	small := newSource(snapshot.Snapshot{Models: []string{"m"}, ContextTokens: 4096})
	large := newSource(snapshot.Snapshot{Models: []string{"m"}, ContextTokens: 32768})
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
