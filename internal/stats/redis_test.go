package stats

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sluice-router/sluice/internal/redistest"
)

func openRedisStore(t *testing.T, url, prefix string) *RedisStore {
	t.Helper()
	s, err := OpenRedis(url, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newRedisTracker returns a tracker on s holding workers, loaded from s.
func newRedisTracker(t *testing.T, s Store, workers ...string) *Tracker {
	t.Helper()
	tr, err := NewTracker(0.3, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range workers {
		if err := tr.Track(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

func obs(i int) Observation {
	return Observation{
		TTFT:         time.Duration(100+7*i) * time.Millisecond,
		E2E:          time.Duration(900+13*i) * time.Millisecond,
		OutputTokens: 50 + i%17,
		DecodeTPS:    30 + float64(i%5)/3,
		Concurrency:  float64(1 + i%3),
	}
}

func TestRedisStore_FoldMatchesEMAAdd(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	tr := newRedisTracker(t, openRedisStore(t, srv.URL(0), ""))
	now := time.Unix(1_700_000_000, 123_456_000).UTC()
	for i := range 40 {
		o := obs(i)
		if i%4 == 0 {
			o.TTFT, o.DecodeTPS = 0, 0 // not measured: must not be folded
		}
		tr.Observe("w1", o, now)
		if i%9 == 0 { // several folds on top of stored state
			if err := tr.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A tracker with no store folds the same samples in Go.
	local := newRedisTracker(t, nil)
	for i := range 40 {
		o := obs(i)
		if i%4 == 0 {
			o.TTFT, o.DecodeTPS = 0, 0
		}
		local.Observe("w1", o, now)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := newRedisTracker(t, openRedisStore(t, srv.URL(0), ""), "w1")
	if diff := cmp.Diff(local.All(), fresh.All(), cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Fatalf("averages folded by Redis differ from EMA.Add's (-go +redis):\n%s", diff)
	}
}

func TestRedisStore_ConcurrentTrackersLoseNothing(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	const replicas, goroutines, perG = 2, 4, 250
	trackers := make([]*Tracker, replicas)
	for i := range trackers {
		trackers[i] = newRedisTracker(t, openRedisStore(t, srv.URL(0), ""))
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var flushers sync.WaitGroup
	for _, tr := range trackers {
		flushers.Add(1)
		go func() { // flush and refresh while others observe, as Run does
			defer flushers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := tr.Flush(ctx); err != nil {
					t.Error(err)
					return
				}
				if err := tr.Refresh(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perG {
					tr.Observe("shared", Observation{TTFT: 200 * time.Millisecond, OutputTokens: 10}, time.Now())
					tr.Observe(fmt.Sprintf("own-%d", g), obs(i), time.Now())
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	flushers.Wait()
	for _, tr := range trackers {
		if err := tr.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, tr := range trackers {
		if err := tr.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		got := tr.Get("shared")
		if want := int64(replicas * goroutines * perG); got.TTFTMs.N != want || got.OutputTokens.N != want {
			t.Errorf("tracker %d: shared worker has %d TTFT and %d output samples, want %d of each", i, got.TTFTMs.N, got.OutputTokens.N, want)
		}
		if got.TTFTMs.Value != 200 || got.DecodeTPS.Known() {
			t.Errorf("tracker %d: shared worker %+v, want TTFT 200 ms and no decode rate", i, got)
		}
		for g := range goroutines {
			if n := tr.Get(fmt.Sprintf("own-%d", g)).E2EMs.N; n != replicas*perG {
				t.Errorf("tracker %d: own-%d has %d samples, want %d", i, g, n, replicas*perG)
			}
		}
	}
}

func TestRedisStore_SurvivesTrackerAndRedisRestart(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{Persist: true})
	ctx := context.Background()
	store := openRedisStore(t, srv.URL(3), "")
	tr := newRedisTracker(t, store)
	now := time.Unix(1_700_000_500, 0).UTC()
	for i := range 10 {
		tr.Observe("w1", obs(i), now)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := tr.All()
	store.Close() // the replica goes away

	srv.Kill() // and Redis crashes
	srv.Restart()

	again := newRedisTracker(t, openRedisStore(t, srv.URL(3), ""), "w1")
	if diff := cmp.Diff(want, again.All()); diff != "" {
		t.Fatalf("averages after restarts (-before +after):\n%s", diff)
	}
}

func TestRedisStore_OutageLosesNoObservation(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	tr := newRedisTracker(t, openRedisStore(t, srv.URL(0), ""))
	for i := range 5 {
		tr.Observe("w1", obs(i), time.Now())
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	for i := range 7 {
		tr.Observe("w1", obs(i), time.Now())
	}
	if err := tr.Flush(ctx); err == nil {
		t.Fatal("flush to a stopped Redis succeeded")
	}
	if got := tr.Get("w1").E2EMs.N; got != 12 {
		t.Fatalf("local view during the outage has %d samples, want 12", got)
	}
	srv.Restart() // empty: no persistence
	tr.Observe("w1", obs(8), time.Now())
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := newRedisTracker(t, openRedisStore(t, srv.URL(0), ""), "w1")
	if got := fresh.Get("w1").E2EMs.N; got != 8 {
		t.Fatalf("Redis has %d samples after it came back, want the 8 observed since it went away", got)
	}
}

func TestRedisStore_DownAtStartIsNotFatal(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	store := openRedisStore(t, srv.URL(0), "")
	srv.Stop()
	tr, err := NewTracker(0.5, store, nil)
	if err != nil {
		t.Fatalf("NewTracker with a shared store down: %v; want a tracker that starts empty", err)
	}
	srv.Restart()
	tr.Observe("w1", obs(1), time.Now())
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRedisStore_PrefixesIsolate(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	a := newRedisTracker(t, openRedisStore(t, srv.URL(0)+"?prefix=a:", ""))
	b := newRedisTracker(t, openRedisStore(t, srv.URL(0), "b:"))
	a.Observe("w1", obs(1), time.Now())
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.All(); len(got) != 0 {
		t.Fatalf("prefix b: sees %v written under prefix a:", got)
	}
}

// With a shared store, a worker forgotten before its observations were
// folded has them folded all the same, and the fold does not bring it
// back into memory.
func TestRedisStore_ForgottenWorkerIsFoldedNotHeld(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	store := openRedisStore(t, srv.URL(0), "")
	tr := newRedisTracker(t, store, "w1")
	for i := range 5 {
		tr.Observe("w1", obs(i), time.Now())
	}
	tr.Forget("w1")
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tr.All(); len(got) != 0 {
		t.Fatalf("the fold brought back %v", got)
	}
	again := newRedisTracker(t, store, "w1")
	if got, want := again.Get("w1").E2EMs.N, int64(5); got != want {
		t.Fatalf("w1 has %d samples in Redis, want %d", got, want)
	}
}
