package prefixshare

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/redistest"
)

// waitLimit bounds every wait for a condition: far above the propagation
// delay, so only a condition that never comes true reaches it.
const waitLimit = 20 * time.Second

type replicaOpts struct {
	maxLen    int64
	queue     int
	capacity  int
	maxHashes int
	window    time.Duration
	noRun     bool
}

// replica returns an Index named name on srv's Redis, running until the
// test ends.
func replica(t testing.TB, srv *redistest.Server, name string, o replicaOpts) *Index {
	t.Helper()
	opts, p, err := redisconn.Parse(srv.URL(0), "test:")
	if err != nil {
		t.Fatal(err)
	}
	x, err := New(Config{
		Redis: opts, Prefix: p, Replica: name,
		Local:  prefix.NewIndex(prefix.Options{Capacity: o.capacity}),
		MaxLen: o.maxLen, Queue: o.queue, MaxHashes: o.maxHashes, Window: o.window,
		Block:      time.Hour, // shutdown must not wait for a blocked XREAD
		MaxBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !o.noRun {
		run(t, x)
	}
	return x
}

func run(t testing.TB, x *Index) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor waits until cond holds, re-checking it whenever x's (or also's)
// counters change, and fails the test after waitLimit.
func waitFor(t testing.TB, x *Index, what string, cond func() bool, also ...*Index) {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		ch := x.Changed()
		var other <-chan struct{}
		if len(also) > 0 {
			other = also[0].Changed()
		}
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-other:
		case <-deadline.C:
			t.Fatalf("%s: not within %v; stats %+v", what, waitLimit, x.Stats())
		}
	}
}

func conv(id, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(id)<<32 | uint64(i+1)
	}
	return hs
}

func TestShare_RecordOnAMatchOnB(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	a := replica(t, srv, "a", replicaOpts{})
	b := replica(t, srv, "b", replicaOpts{})
	turn := conv(1, 8)
	a.Record("m", turn, "w1")
	waitFor(t, b, "B sees A's record", func() bool { return match(b, "m", turn, "w1") == 1 })
	if got, remote := matchSource(b, "m", turn, "w1"); got != 1 || !remote {
		t.Errorf("B's MatchSource = %v, %v; want 1, true (learnt from A)", got, remote)
	}
	if got := match(b, "m", turn, "w2"); got != 0 {
		t.Errorf("another worker on B: Match = %v, want 0", got)
	}
	if got := match(b, "other", turn, "w1"); got != 0 {
		t.Errorf("another model on B: Match = %v, want 0", got)
	}
	// B's record reaches A; A applies B's and skips its own: once A has
	// applied B's (after its own in the stream), it has applied one.
	next := conv(2, 4)
	b.Record("m", next, "w2")
	waitFor(t, a, "A sees B's record", func() bool { return match(a, "m", next, "w2") == 1 })
	waitFor(t, b, "B counts its publish", func() bool { return b.Stats().Published == 1 })
	if got := a.Stats().Applied; got != 1 {
		t.Errorf("A applied %d records, want 1 (B's; its own skipped)", got)
	}
	if _, remote := matchSource(a, "m", turn, "w1"); remote {
		t.Errorf("A's own record came back as remote")
	}
	if s := b.Stats(); s.Published != 1 || s.Applied != 1 || s.Dropped != 0 || s.Failed != 0 || !s.Up {
		t.Errorf("B's stats = %+v; want 1 published, 1 applied, none dropped or failed, up", s)
	}
}

func TestShare_Bounds(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	// Prompts of 24 blocks, entries of at most 16, B remembers 8 of a
	// worker and C 64.
	const maxLen, maxHashes, capacity, records = 100, 16, 8, 1000
	window := time.Minute
	a := replica(t, srv, "a", replicaOpts{maxLen: maxLen, maxHashes: maxHashes, window: window, queue: records})
	b := replica(t, srv, "b", replicaOpts{capacity: capacity, window: window})
	c := replica(t, srv, "c", replicaOpts{capacity: 64, window: window})
	for i := range records {
		a.Record("m", conv(i, 3*capacity), "w")
	}
	// B may miss entries trimmed before it read them, never the last.
	lastConv := conv(records-1, 3*capacity)
	waitFor(t, b, "B applies A's last record", func() bool { return match(b, "m", lastConv, "w") > 0 })
	waitFor(t, c, "C applies A's last record", func() bool { return match(c, "m", lastConv, "w") > 0 })
	waitFor(t, a, "A publishes every record", func() bool { return a.Stats().Published == records })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	// The approximate trim removes whole nodes of 100 entries.
	if n := rdb.XLen(ctx, a.Key()).Val(); n > maxLen+100 {
		t.Errorf("stream length %d after %d records, over MaxLen %d plus one node of 100", n, records, maxLen)
	}
	if d := rdb.PTTL(ctx, a.Key()).Val(); d <= 0 || d > window {
		t.Errorf("stream TTL %v, want in (0, %v]", d, window)
	}
	last := rdb.XRevRangeN(ctx, a.Key(), "+", "-", 1).Val()
	if len(last) != 1 {
		t.Fatalf("stream has no last entry")
	}
	if h, _ := last[0].Values["h"].(string); len(h) != 8*maxHashes {
		t.Errorf("an entry carries %d bytes of hashes, want %d (MaxHashes %d)", len(h), 8*maxHashes, maxHashes)
	}
	if got := b.local.Len("m", "w"); got > capacity {
		t.Errorf("B's index holds %d blocks of the worker, over its capacity %d", got, capacity)
	}
	if got := b.Stats().Applied; got > records {
		t.Errorf("B applied %d records of %d", got, records)
	}
	if got, want := match(b, "m", lastConv, "w"), 1.0/3; got != want {
		t.Errorf("B's match of A's last conversation = %v, want %v (its first %d blocks, B's capacity)", got, want, capacity)
	}
	if got, want := match(c, "m", lastConv, "w"), 2.0/3; got != want {
		t.Errorf("C's match of A's last conversation = %v, want %v (its first %d blocks, an entry's)", got, want, maxHashes)
	}
}

func TestShare_QueueFullDrops(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	a := replica(t, srv, "a", replicaOpts{queue: 4, noRun: true}) // no publisher drains it
	for i := range 10 {
		a.Record("m", conv(i, 2), "w")
	}
	if s := a.Stats(); s.Dropped != 6 {
		t.Errorf("10 records into a queue of 4 with no publisher: %d dropped, want 6", s.Dropped)
	}
	if got := match(a, "m", conv(9, 2), "w"); got != 1 {
		t.Errorf("a dropped record is still in the local index: Match = %v, want 1", got)
	}
}

func TestShare_RedisDownThenBack(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	a := replica(t, srv, "a", replicaOpts{queue: 16})
	b := replica(t, srv, "b", replicaOpts{})
	before := conv(1, 4)
	a.Record("m", before, "w")
	waitFor(t, b, "B sees A's record before the outage", func() bool { return match(b, "m", before, "w") == 1 })

	srv.Kill()
	// Record and Match run on local state only: with Redis gone they
	// neither fail nor wait; records beyond the queue are dropped.
	for i := range 1000 {
		a.Record("m", conv(100+i, 4), "w")
		if got := match(a, "m", conv(100+i, 4), "w"); got != 1 {
			t.Fatalf("A's Match of its own record during the outage = %v, want 1", got)
		}
	}
	if got := match(b, "m", before, "w"); got != 1 {
		t.Errorf("B's index lost what it learnt before the outage: Match = %v", got)
	}
	waitFor(t, a, "A notices the outage", func() bool { s := a.Stats(); return !s.Up && s.Dropped > 0 && s.Failed > 0 })

	srv.Restart() // empty: no persistence
	after := conv(2, 4)
	// Record again whenever a publish fails until A's publisher is back.
	waitFor(t, a, "A publishes again", func() bool {
		a.Record("m", after, "w")
		return a.Stats().Up && a.Stats().Published > 1
	})
	waitFor(t, b, "B sees A's record after Redis came back", func() bool {
		if match(b, "m", after, "w") == 1 {
			return true
		}
		a.Record("m", after, "w") // in case the last one's publish failed
		return false
	}, a)
}

func TestShare_LateReplicaWarmsUp(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	window := time.Minute
	a := replica(t, srv, "a", replicaOpts{window: window})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	// An entry from before the window (Redis's clock minus twice the window).
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	old := conv(9, 2)
	oldID := fmt.Sprintf("%d-0", now.Add(-2*window).UnixMilli())
	var h []byte
	for _, v := range old {
		h = binary.LittleEndian.AppendUint64(h, v)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: a.Key(), ID: oldID, Values: []any{"r", "gone", "m", "m", "w", "w", "h", h}}).Err(); err != nil {
		t.Fatal(err)
	}
	convs := [][]uint64{conv(1, 4), conv(2, 4), conv(3, 4)}
	for _, c := range convs {
		a.Record("m", c, "w")
	}
	waitFor(t, a, "A publishes", func() bool { return a.Stats().Published == uint64(len(convs)) })

	late := replica(t, srv, "late", replicaOpts{window: window})
	waitFor(t, late, "the late replica applies the window", func() bool { return late.Stats().Applied == uint64(len(convs)) })
	for i, c := range convs {
		if got := match(late, "m", c, "w"); got != 1 {
			t.Errorf("conversation %d on the late replica: Match = %v, want 1", i, got)
		}
	}
	if got := match(late, "m", old, "w"); got != 0 {
		t.Errorf("an entry older than the window was applied: Match = %v", got)
	}
	if s := late.Stats(); s.Lag != 0 {
		t.Errorf("warm-up entries counted in the lag: %v", s.Lag)
	}

	// A restarted A (same name, new process) warms up from what it
	// recorded before: only the running Index's own entries are skipped.
	again := replica(t, srv, "a", replicaOpts{window: window})
	waitFor(t, again, "the restarted replica applies its earlier records", func() bool { return again.Stats().Applied == uint64(len(convs)) })
	for i, c := range convs {
		if got := match(again, "m", c, "w"); got != 1 {
			t.Errorf("conversation %d on the restarted replica: Match = %v, want 1", i, got)
		}
	}
}

// BenchmarkPropagation measures the delay from a Record on one replica to
// the other replica's Match seeing it, through a real Redis on loopback.
func BenchmarkPropagation(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	a := replica(b, srv, "a", replicaOpts{})
	r := replica(b, srv, "b", replicaOpts{})
	i := 0
	var took []time.Duration
	for b.Loop() {
		i++
		c := conv(i, 4)
		start := time.Now()
		a.Record("m", c, "w")
		waitFor(b, r, "B sees the record", func() bool { return match(r, "m", c, "w") == 1 })
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRecord measures the pick path's Record of a 40-block prompt:
// the local index alone (as without Redis), then the local index plus a
// queued copy, with Redis up (the allocations include the publisher's) and
// with Redis down.
func BenchmarkRecord(b *testing.B) {
	hs := prefix.Text(fmt.Sprint(1)+string(make([]byte, 40*prefix.BlockBytes)), prefix.BlockBytes)
	b.Run("local", func(b *testing.B) {
		x := prefix.NewIndex(prefix.Options{})
		b.ReportAllocs()
		for b.Loop() {
			x.Record("m", hs, "w")
		}
	})
	b.Run("up", func(b *testing.B) {
		srv := redistest.Start(b, redistest.Options{})
		x := replica(b, srv, "a", replicaOpts{})
		b.ReportAllocs()
		for b.Loop() {
			x.Record("m", hs, "w")
		}
	})
	b.Run("down", func(b *testing.B) {
		srv := redistest.Start(b, redistest.Options{})
		x := replica(b, srv, "a", replicaOpts{})
		srv.Kill()
		b.ReportAllocs()
		for b.Loop() {
			x.Record("m", hs, "w")
		}
	})
}

// TestShare_RedisThatNeverAnswers points a replica at a listener that
// accepts connections and never answers, as a hung Redis would: Record and
// Match go on without it, the publish times out, records beyond the queue
// are dropped and counted.
func TestShare_RedisThatNeverAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-accepted
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	opts, p, err := redisconn.Parse("redis://"+l.Addr().String()+"/0", "test:")
	if err != nil {
		t.Fatal(err)
	}
	x, err := New(Config{
		Redis: opts, Prefix: p, Replica: "a", Local: prefix.NewIndex(prefix.Options{}),
		Queue: 8, Block: time.Hour, MaxBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, x)
	for i := range 1000 {
		x.Record("m", conv(i, 4), "w")
		if got := match(x, "m", conv(i, 4), "w"); got != 1 {
			t.Fatalf("Match of record %d with Redis hung = %v, want 1", i, got)
		}
	}
	if s := x.Stats(); s.Dropped == 0 {
		t.Errorf("1000 records into a queue of 8 with Redis hung: none dropped (%+v)", s)
	}
	waitFor(t, x, "the publish times out", func() bool { s := x.Stats(); return s.Failed > 0 && !s.Up })
}

// match is MatchSources for one worker.
func match(x interface {
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
}, model string, hashes []uint64, worker string) float64 {
	f, _ := matchSource(x, model, hashes, worker)
	return f
}

// matchSource is MatchSources for one worker, with whether the match came
// from another replica.
func matchSource(x interface {
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
}, model string, hashes []uint64, worker string) (float64, bool) {
	frac, remote := make([]float64, 1), make([]bool, 1)
	x.MatchSources(model, hashes, []string{worker}, frac, remote)
	return frac[0], remote[0]
}
