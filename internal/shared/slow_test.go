package shared

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// slowProxy forwards TCP connections on loopback to addr, holding every
// reply from addr back by delay (in order): a Redis far away, or a slow
// one. It stops when the test ends.
func slowProxy(t testing.TB, addr string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c ...net.Conn) {
		mu.Lock()
		conns = append(conns, c...)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			track(c, s)
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer wg.Done(); delayedCopy(c, s, delay); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// delayedCopy copies src to dst, each chunk delay after it was read.
func delayedCopy(dst io.Writer, src io.Reader, delay time.Duration) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		timer := time.NewTimer(time.Until(c.due)) // the delay itself, not synchronisation
		<-timer.C
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// slowReplica is a scheduler over workers w0 and w1 (both serving models a
// and b, limit 4) whose ledger's Redis answers 100 ms late.
func slowReplica(t testing.TB) (*scheduler.Scheduler, *Ledger) {
	t.Helper()
	srv := startRedis(t)
	// Calls may take a few round trips (a new connection's handshake, a
	// script's first load): well within the call timeout, so that the
	// ledger stays up.
	l := newLedger(t, "redis://"+slowProxy(t, srv.Addr(), 100*time.Millisecond)+"/0", "slow", ledgerOpts{call: 5 * time.Second})
	s, err := scheduler.New(scheduler.Config{
		Weights: scheduler.DefaultWeights(), MaxQueue: 64, QueueTimeout: time.Minute, StaleAfter: time.Minute,
		Ledger: l.ForScheduler(context.Background()), Limits: limit.Config{Fixed: true},
	}, scheduler.WorkerSpec{Name: "w0", Models: []string{"a", "b"}, MaxConcurrency: 4},
		scheduler.WorkerSpec{Name: "w1", Models: []string{"a", "b"}, MaxConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// Warm up: connections dialled and the scripts loaded (each of those
	// is a round trip too), for both models' calls at once.
	var wg sync.WaitGroup
	for _, m := range []string{"a", "b", "a", "b", "a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.Admit(context.Background(), scheduler.Request{Model: m})
			if err != nil {
				t.Error(err)
				return
			}
			l.Release()
		}()
	}
	wg.Wait()
	s.FlushLedger()
	if l.Degraded() {
		t.Fatal("the ledger went down while warming up")
	}
	return s, l
}

// With a Redis that answers 100 ms late, the ledger's round trips hold up
// only the requests that wait for their answer: a request of another
// model is not queued behind them, and what needs no answer — a refusal,
// reading the admission state — is done while they are outstanding. (The
// scheduler used to ask the ledger under its one lock, so every request
// and every reader of every model waited for each round trip in turn.)
func TestScheduler_SlowRedisHoldsUpOnlyWhoWaitsForIt(t *testing.T) {
	s, l := slowReplica(t)
	// Each ticket's callback says its name when bound; the callback may
	// run after the ticket reads as done, so the order is read from here.
	boundNames := make(chan string, 5)
	note := func(name string) func(*scheduler.Ticket) {
		return func(*scheduler.Ticket) { boundNames <- name }
	}
	// Four of model a: each asks the ledger after the one before it has
	// its answer (a model's calls are made in order), 100 ms apiece; b's
	// one round trip runs beside them.
	var as []*scheduler.Ticket
	for _, n := range []string{"a1", "a2", "a3", "a4"} {
		as = append(as, s.Submit(scheduler.Request{Model: "a"}, note(n)))
	}
	b := s.Submit(scheduler.Request{Model: "b"}, note("b"))
	// What needs no answer is done while a's are outstanding.
	if _, err := s.Admit(context.Background(), scheduler.Request{Model: "a", Class: "nope"}); !errors.Is(err, scheduler.ErrUnknownClass) {
		t.Fatalf("unknown class: %v", err)
	}
	if ws := s.Workers(); len(ws) != 2 {
		t.Fatalf("workers: %+v", ws)
	}
	if d := s.QueueDepths(); d["a"] != 3 {
		t.Fatalf("queue depths while the first of a asks: %v, want 3 of a waiting their turn", d)
	}
	if as[3].Done() {
		t.Fatal("the fourth request of a was placed before the ledger could have answered")
	}
	var leases []*scheduler.Lease
	for _, tk := range append(as, b) {
		leases = append(leases, bound(t, tk))
	}
	var got []string
	for range 5 {
		got = append(got, <-boundNames)
	}
	if ib, ia := slices.Index(got, "b"), slices.Index(got, "a4"); ib < 0 || ib > ia {
		t.Fatalf("bound in order %v: model b waited behind model a's round trips", got)
	}
	for _, l := range leases {
		l.Release()
	}
	if l.Degraded() {
		t.Fatal("the ledger was down: the requests were placed on the local view")
	}
}

// BenchmarkSlowRedis_LocalOnlyPick measures a pick that needs no ledger
// answer — a refusal, which still scores every worker for its record —
// while requests of another model keep a round trip to a Redis 100 ms
// away outstanding. It reports the pick's p99, p99.9 and slowest; run it
// for seconds (-benchtime 2s), so that the round trips overlap it.
func BenchmarkSlowRedis_LocalOnlyPick(b *testing.B) {
	s, _ := slowReplica(b)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // model a: always one reservation outstanding
		defer wg.Done()
		for ctx.Err() == nil {
			l, err := s.Admit(ctx, scheduler.Request{Model: "a"})
			if err == nil {
				l.Release()
			}
		}
	}()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		s.Submit(scheduler.Request{Model: "b", Class: "nope"}, nil)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
}
