package scheduler

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// levels builds worker stats from per-level (mean, sd, samples).
func levels(now time.Time, ls ...[3]float64) stats.WorkerStats {
	var out []stats.Level
	for _, l := range ls {
		mean, sd, n := l[0], l[1], int64(l[2])
		out = append(out, stats.Level{
			DecodeTPS: stats.EMA{Value: mean, N: n},
			DecodeSq:  stats.EMA{Value: mean*mean + sd*sd, N: n},
			Updated:   now,
		})
	}
	return stats.WorkerStats{Levels: stats.NewLevels(out...)}
}

func ptr[T any](v T) *T { return &v }

// learnedOne is a worker's stats whose second stream decodes under a
// floor of 50 tok/s and delays first tokens past waiting for the first:
// its learned limit is 1.
func learnedOne(now time.Time) stats.WorkerStats {
	return withTTFT(levels(now, [3]float64{80, 1, 5}, [3]float64{30, 1, 5}), 400, 200, 900)
}

// withTTFT sets each level's mean time to first token (ms) and the
// worker's mean end-to-end time.
func withTTFT(ws stats.WorkerStats, e2eMs float64, ttftMs ...float64) stats.WorkerStats {
	for i, v := range ttftMs {
		ws.Levels = ws.Levels.With(i+1, func(l *stats.Level) { l.TTFTMs = stats.EMA{Value: v, N: l.DecodeTPS.N} })
	}
	ws.E2EMs = stats.EMA{Value: e2eMs, N: 9}
	return ws
}

// Without a configured floor, it is half the best solo rate among the
// model's workers: the fleet is judged against its own fastest card.
func TestLimit_FloorFollowsTheFastestCard(t *testing.T) {
	now := time.Unix(10000, 0)
	fs := fakeStats{
		"fast": withTTFT(levels(now, [3]float64{80, 1, 5}, [3]float64{50, 1, 5}, [3]float64{38, 1, 5}), 400, 200, 300, 900),
		"slow": withTTFT(levels(now, [3]float64{45, 1, 5}, [3]float64{36, 1, 5}), 400, 200, 900),
	}
	s := newSched(t, Config{MaxQueue: 5, Stats: fs, Clock: fixedClock{now}, Limits: limit.Config{MinSamples: 3}},
		WorkerSpec{Name: "fast", Models: []string{"m"}, MaxConcurrency: 4},
		WorkerSpec{Name: "slow", Models: []string{"m"}, MaxConcurrency: 4})
	ws := s.Workers()
	if got, want := ws[0].Floor, 40.0; got != want {
		t.Fatalf("floor %v, want %v (half of 80)", got, want)
	}
	if ws[0].Learned != 2 || ws[1].Learned != 1 {
		t.Fatalf("learned fast %d slow %d, want 2 and 1: %s / %s", ws[0].Learned, ws[1].Learned, ws[0].LimitReason, ws[1].LimitReason)
	}
}

// A worker that says it is saturated (its own queue, a full KV cache)
// gets nothing more than it runs, whatever was learned.
func TestLimit_SaturatedWorkerTakesNoMore(t *testing.T) {
	now := time.Unix(10000, 0)
	fs := fakeStats{"w": levels(now, [3]float64{80, 1, 5}, [3]float64{75, 1, 5}, [3]float64{70, 1, 5}, [3]float64{65, 1, 5})}
	for _, snap := range []snapshot.Snapshot{
		{QueueLen: snapshot.Reading{Value: 2, At: now, Source: "test"}},
		{KVPressure: snapshot.Reading{Value: 0.97, At: now, Source: "test"}},
	} {
		s := newSched(t, Config{MaxQueue: 5, Stats: fs, Clock: fixedClock{now}, StaleAfter: 3 * time.Second,
			Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3}},
			WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(snap)})
		if _, err := s.Admit(context.Background(), Request{Model: "m"}); err != nil {
			t.Fatal(err)
		}
		tk := s.Submit(Request{Model: "m"}, nil)
		if tk.Done() {
			l, _ := tk.Result()
			t.Fatalf("second request bound (limit %d) although the worker reports %+v", l.Limit, snap)
		}
		if r := s.Workers()[0].LimitReason; !strings.Contains(r, "no more than in flight") {
			t.Fatalf("reason %q does not say why", r)
		}
	}
}

// A request that waits long enough lets a worker run one stream over its
// learned limit, and nothing but the wait has to happen for it.
func TestLimit_BorrowsWhenTheQueueWaits(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	now := clk.Now()
	fs := fakeStats{"w": learnedOne(now)}
	s := newSched(t, Config{MaxQueue: 5, QueueTimeout: time.Minute, Stats: fs, Clock: clk,
		Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3, BorrowAfter: 2 * time.Second}},
		WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 4})
	held, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	got := make(chan *Lease, 1)
	go func() {
		l, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	clk.AwaitTimers(2) // the waiter has armed its timeout and its borrow step
	clk.Advance(1999 * time.Millisecond)
	select {
	case l := <-got:
		t.Fatalf("bound before borrowing was due: %+v", l)
	default:
	}
	clk.Advance(time.Millisecond)
	l := <-got
	defer l.Release()
	if l.Limit != 2 {
		t.Fatalf("bound at limit %d, want 2 (learned 1, borrowing 1)", l.Limit)
	}
	rec := l.Decision.Explain()
	if r := rec.Candidates[0].LimitReason; !strings.Contains(r, "borrowing +1") {
		t.Fatalf("record's limit reason %q does not say it borrowed", r)
	}
}

// MeanConcurrency is the time-weighted number in flight over a lease's
// life: what its measurements are filed under.
func TestLease_MeanConcurrency(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	s := newSched(t, Config{MaxQueue: 5, Clock: clk, Limits: limit.Config{Fixed: true}}, WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 4})
	a, _ := s.Admit(context.Background(), Request{Model: "m"})
	clk.Advance(time.Second) // alone for 1s
	b, _ := s.Admit(context.Background(), Request{Model: "m"})
	clk.Advance(3 * time.Second) // two for 3s
	if got, want := a.MeanConcurrency(), 1.75; got != want {
		t.Fatalf("a ran at %v, want %v", got, want)
	}
	if got, want := b.MeanConcurrency(), 2.0; got != want {
		t.Fatalf("b ran at %v, want %v", got, want)
	}
	a.Release()
	b.Release()
}

// /api/workers says when the learned limit last moved, from what and why.
func TestLimit_SaysWhyItLastMoved(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	now := clk.Now()
	fs := fakeStats{"w": withTTFT(levels(now, [3]float64{80, 1, 5}, [3]float64{70, 1, 5}, [3]float64{65, 1, 5}), 400, 200, 300, 400)}
	s := newSched(t, Config{MaxQueue: 5, Stats: fs, Clock: clk, Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3}},
		WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 8})
	if got := s.Workers()[0].Learned; got != 8 {
		t.Fatalf("learned %d, want 8 (the cap: every level holds)", got)
	}
	clk.Advance(time.Minute)
	fs["w"] = withTTFT(levels(clk.Now(), [3]float64{80, 1, 5}, [3]float64{70, 1, 5}, [3]float64{45, 1, 5}), 400, 200, 300, 900) // level 3 slowed
	m := s.Workers()[0].LimitMoved
	if m == nil || m.From != 8 || m.To != 2 || !m.At.Equal(clk.Now()) || !strings.Contains(m.Why, "at 3 streams the slowest decode 44.0") {
		t.Fatalf("limit_moved %+v, want from 8 to 2 now, because of level 3", m)
	}
}

// A record must say, whenever it is read, what was true when it was made:
// its limits' reasons and its score breakdown are built lazily, from
// values kept at decision time, and later picks, releases, observations
// and telemetry must not change them. Two identical runs, one reading
// every record at once and one only at the end, must agree.
func TestRecords_ReadLateSayWhatWasTrue(t *testing.T) {
	run := func(readAtOnce bool) []string {
		clk := clocktest.NewManualClock(time.Unix(10000, 0))
		tr, err := stats.NewTracker(0.5, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var srcs []*mutableSource
		ws := workers(3, 3, "m")
		for i := range ws {
			srcs = append(srcs, newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPressure: snapshot.Reading{Value: 0.1 * float64(i), Source: "kv", At: clk.Now()}}))
			ws[i].Source = srcs[i]
		}
		var recs []*decisions.Record
		var read []string
		record := func(r *decisions.Record) {
			recs = append(recs, r)
			if readAtOnce {
				b, err := json.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				read = append(read, string(b))
			}
		}
		other := WorkerSpec{Name: "other", Models: []string{"x"}, MaxConcurrency: 2} // never eligible
		s := newSched(t, Config{MaxQueue: 10, Stats: tr, Clock: clk, Recorder: record,
			Limits: limit.Config{MinSamples: 1, BorrowAfter: time.Second}}, append(ws, other)...)
		var held []*Lease
		for i := range 24 {
			tk := s.Submit(Request{Model: "m", PromptTokens: 10 + i}, nil)
			if l, err := tk.Result(); err == nil && l != nil {
				held = append(held, l)
			}
			// Everything the records read changes after each decision.
			w := ws[i%len(ws)].Name
			tr.Observe(w, stats.Observation{TTFT: time.Duration(100+10*i) * time.Millisecond, OutputTokens: 50, DecodeTPS: float64(20 + 5*(i%4)), Concurrency: float64(1 + i%3)}, clk.Now())
			srcs[i%len(srcs)].Set(snapshot.Snapshot{Health: snapshot.HealthOK, QueueLen: snapshot.Reading{Value: float64(i % 2), Source: "q", At: clk.Now()}, KVPressure: snapshot.Reading{Value: 0.03 * float64(i), Source: "kv", At: clk.Now()}})
			clk.Advance(700 * time.Millisecond)
			if i%3 == 2 {
				for _, l := range held {
					l.Complete(stats.Observation{OutputTokens: 40}, nil, clk.Now())
				}
				held = nil
			}
		}
		for _, l := range held {
			l.Release()
		}
		if !readAtOnce {
			for _, r := range recs {
				b, err := json.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				read = append(read, string(b))
			}
		}
		return read
	}
	atOnce, late := run(true), run(false)
	if len(atOnce) < 24 {
		t.Fatalf("%d records, want at least 24", len(atOnce))
	}
	if diff := cmp.Diff(atOnce, late); diff != "" {
		t.Fatalf("records read late differ from records read at once (-at once +late):\n%s", diff)
	}
	if !strings.Contains(strings.Join(late, ""), "limit_reason") || !strings.Contains(strings.Join(late, ""), `"terms"`) {
		t.Fatal("records explain neither limits nor terms: the test tests nothing")
	}
}

// stableStats is a StatsReader whose values keep their address until the
// test replaces them, as *stats.Tracker's do.
type stableStats map[string]*stats.WorkerStats

func (f stableStats) Stats(w string) *stats.WorkerStats { return f[w] }

// A limit the affinity relaxation raised for one request is not kept for
// the next: that one is held to the learned limit again.
func TestLimit_RaisedForAPrefixIsNotKept(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	two := withTTFT(levels(clk.Now(), [3]float64{80, 1, 5}, [3]float64{70, 1, 5}, [3]float64{30, 1, 5}), 400, 200, 300, 900) // learned 2
	fs := stableStats{"w0": &two}
	s := newSched(t, Config{MaxQueue: 10, Clock: clk, Stats: fs, PrefixIndex: prefix.NewIndex(prefix.Options{}),
		Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3, ProbeAfter: time.Hour}}, workers(1, 4, "m")...)
	conv := []uint64{1, 2, 3, 4}
	for range 2 {
		defer admitNow(t, s, Request{Model: "m", Prefix: conv}).Release()
	}
	over := admitNow(t, s, Request{Model: "m", Prefix: append(conv[:4:4], 5)})
	if over.Limit != 3 {
		t.Fatalf("the cached prefix ran at limit %d; want 3, one over the learned 2", over.Limit)
	}
	over.Release()
	// w0 runs two again, its learned limit: nobody else may start.
	queued(t, s, Request{Model: "m", Prefix: []uint64{7, 8}})
}
