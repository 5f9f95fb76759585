package stats

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestEMA_Add(t *testing.T) {
	var e EMA
	e = e.Add(100, 0.5)
	if e.Value != 100 || e.N != 1 {
		t.Fatalf("first sample: %+v, want value 100", e)
	}
	e = e.Add(200, 0.5)
	if got, want := e.Value, 150.0; got != want {
		t.Fatalf("second sample: %v, want %v", got, want)
	}
}

func TestTracker_ObserveSkipsUnknownFields(t *testing.T) {
	tr, err := NewTracker(0.5, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100, 0)
	tr.Observe("w", Observation{TTFT: 200 * time.Millisecond, OutputTokens: 10, DecodeTPS: 40}, now)
	tr.Observe("w", Observation{E2E: time.Second, OutputTokens: 20}, now) // non-streamed: no TTFT
	got := tr.Get("w")
	want := WorkerStats{
		TTFTMs:       EMA{Value: 200, N: 1},
		DecodeTPS:    EMA{Value: 40, N: 1},
		OutputTokens: EMA{Value: 15, N: 2},
		E2EMs:        EMA{Value: 1000, N: 1},
		Updated:      now,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("stats (-want +got):\n%s", diff)
	}
}

func TestNewTracker_RejectsBadAlpha(t *testing.T) {
	for _, a := range []float64{0, -1, 1.5} {
		if _, err := NewTracker(a, nil, nil); err == nil {
			t.Errorf("alpha %v accepted", a)
		}
	}
}

func TestBoltStore_SurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTracker(0.2, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	tr.Observe("slow", Observation{TTFT: 900 * time.Millisecond, DecodeTPS: 12}, now)
	tr.Observe("fast", Observation{TTFT: 90 * time.Millisecond, DecodeTPS: 80}, now)
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := tr.All()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	tr2, err := NewTracker(0.2, s2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"slow", "fast"} {
		if err := tr2.Track(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, tr2.All()); diff != "" {
		t.Fatalf("after reopen (-want +got):\n%s", diff)
	}
}

func TestBoltStore_SecondOpenFailsFastInsteadOfHanging(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := OpenBolt(path, nil); err == nil {
		t.Fatal("a second open of a locked store succeeded")
	}
}

// failingStore fails Save until ok is set.
type failingStore struct {
	ok    bool
	saved map[string]WorkerStats
}

func (f *failingStore) Load(context.Context, []string) (map[string]WorkerStats, error) {
	return map[string]WorkerStats{}, nil
}
func (f *failingStore) Save(_ context.Context, m map[string]WorkerStats) error {
	if !f.ok {
		return errors.New("disk full")
	}
	f.saved = m
	return nil
}
func (f *failingStore) Close() error { return nil }

// TestTracker_RunFlushesOnceMoreWhenItEnds: a clean shutdown loses no
// sample, however long until the next tick.
func TestTracker_RunFlushesOnceMoreWhenItEnds(t *testing.T) {
	st := &failingStore{ok: true}
	tr, err := NewTracker(Alpha, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Run(ctx, time.Hour)
	}()
	tr.Observe("w", Observation{TTFT: time.Second}, time.Unix(1, 0))
	cancel()
	<-done
	if got := st.saved["w"].TTFTMs; got != (EMA{Value: 1000, N: 1}) {
		t.Fatalf("saved TTFT %+v after Run ended, want the one sample", got)
	}
}

func TestTracker_FailedFlushIsRetried(t *testing.T) {
	st := &failingStore{}
	tr, _ := NewTracker(0.2, st, nil)
	tr.Observe("w", Observation{TTFT: time.Second}, time.Unix(1, 0))
	if err := tr.Flush(context.Background()); err == nil {
		t.Fatal("flush to a failing store reported success")
	}
	st.ok = true
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.saved["w"]; !ok {
		t.Fatal("the entry that failed to save was not retried")
	}
}

func TestTracker_ObserveLearnsPerLevel(t *testing.T) {
	tr, err := NewTracker(0.5, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100, 0)
	tr.Observe("w", Observation{DecodeTPS: 70, TTFT: 100 * time.Millisecond, Concurrency: 1}, now)
	before := tr.Stats("w")
	tr.Observe("w", Observation{DecodeTPS: 40, Concurrency: 2.6}, now) // level 3
	tr.Observe("w", Observation{DecodeTPS: 60, Concurrency: 3.2}, now) // level 3
	got := tr.Get("w")
	if got, want := got.Levels.Len(), 3; got != want {
		t.Fatalf("levels %d, want %d", got, want)
	}
	if got, want := got.Level(1).DecodeTPS.Value, 70.0; got != want {
		t.Fatalf("level 1 rate %v, want %v", got, want)
	}
	l3 := got.Level(3)
	if got, want := l3.DecodeTPS.Value, 50.0; got != want {
		t.Fatalf("level 3 rate %v, want %v", got, want)
	}
	// Samples 40 and 60 with alpha 0.5: E[x]=50, E[x^2]=(1600+3600)/2=2600, sd 10.
	if got, want := l3.StdDev(), 10.0; got != want {
		t.Fatalf("level 3 sd %v, want %v", got, want)
	}
	if got.Level(2).DecodeTPS.Known() || got.Level(9).DecodeTPS.Known() {
		t.Fatal("levels never observed have history")
	}
	if got, want := before.Levels.Len(), 1; got != want {
		t.Fatalf("an earlier value changed under its reader: %d levels, want %d", got, want)
	}
}

// BenchmarkTracker_Observe measures one observation with many workers
// known: it must not copy every worker's entry.
func BenchmarkTracker_Observe(b *testing.B) {
	for _, n := range []int{8, 512} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			tr, err := NewTracker(0.2, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(100, 0)
			for i := range n {
				tr.Observe(fmt.Sprintf("w%d", i), Observation{DecodeTPS: 50, Concurrency: 2}, now)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				tr.Observe(fmt.Sprintf("w%d", i%n), Observation{DecodeTPS: 50, E2E: time.Second, Concurrency: 2}, now)
			}
		})
	}
}

// mapStore is a Store in memory whose entries a test sets.
type mapStore struct{ m map[string]WorkerStats }

func (s *mapStore) Load(_ context.Context, workers []string) (map[string]WorkerStats, error) {
	return only(s.m, workers), nil
}

// only returns the entries of m named in workers, as a Store's Load does.
func only(m map[string]WorkerStats, workers []string) map[string]WorkerStats {
	out := map[string]WorkerStats{}
	for _, name := range workers {
		if ws, ok := m[name]; ok {
			out[name] = ws
		}
	}
	return out
}
func (s *mapStore) Save(context.Context, map[string]WorkerStats) error { return nil }
func (s *mapStore) Close() error                                       { return nil }

// A Handle must never serve stale stats: not after an observation, nor
// when another worker's first observation copies the map, nor when a
// Refresh replaces the entries.
func TestTracker_StatsViaFollowsEveryChange(t *testing.T) {
	store := &mapStore{m: map[string]WorkerStats{}}
	tr, err := NewTracker(0.5, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ha, hb Handle
	check := func(step string) {
		t.Helper()
		for _, c := range []struct {
			h    *Handle
			name string
		}{{&ha, "a"}, {&hb, "b"}} {
			if got, want := tr.StatsVia(c.h, c.name), tr.Stats(c.name); got != want {
				t.Fatalf("%s: StatsVia(%s) = %v, Stats = %v", step, c.name, got, want)
			}
		}
	}
	now := time.Unix(100, 0)
	check("empty")
	tr.Observe("a", Observation{DecodeTPS: 40}, now)
	check("a seen first")
	tr.Observe("a", Observation{DecodeTPS: 20}, now)
	check("a observed again")
	tr.Observe("b", Observation{DecodeTPS: 10}, now)
	check("b seen first")
	store.m = map[string]WorkerStats{"a": {DecodeTPS: EMA{Value: 99, N: 9}}}
	if err := tr.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("refreshed")
	if got := tr.StatsVia(&ha, "a").DecodeTPS.Value; got != 99 {
		t.Fatalf("after refresh a decodes %v, want 99", got)
	}
}
