package stats

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// held returns the names a tracker holds in memory, sorted.
func held(tr *Tracker) []string {
	return slices.Sorted(maps.Keys(tr.All()))
}

// A store keeps the averages of every worker it was ever given
// (Kubernetes names workers after pods, so each rollout adds names); a
// tracker that starts holds none of them until a worker is in the fleet.
func TestNewTracker_HoldsNoWorkerItIsNotToldOf(t *testing.T) {
	stored := map[string]WorkerStats{}
	for i := range 30 {
		stored[fmt.Sprintf("pod-%d", i)] = sample(int64(i + 1))
	}
	path := filled(t, stored)
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr, err := NewTracker(0.2, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := held(tr); len(got) != 0 {
		t.Fatalf("a tracker just started holds %d workers' stats from the store, want none until told of one", len(got))
	}
}

// Refresh reloads the workers the tracker holds, not every name the
// store was ever given.
func TestTracker_RefreshReloadsOnlyTheWorkersHeld(t *testing.T) {
	st := &memStore{m: map[string]WorkerStats{}}
	tr, err := NewTracker(0.2, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.Observe("live", Observation{TTFT: time.Second}, time.Unix(1, 0))
	for i := range 30 {
		st.m[fmt.Sprintf("pod-%d", i)] = sample(int64(i + 1))
	}
	st.m["live"] = sample(7)
	if err := tr.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"live"}, held(tr)); diff != "" {
		t.Fatalf("after Refresh the tracker holds (-want +got):\n%s", diff)
	}
	if got, want := tr.Get("live").TTFTMs.N, int64(7); got != want {
		t.Fatalf("live has %d samples after Refresh, want the store's %d", got, want)
	}
}

// askedStore is a memStore that records which workers each Load asked for.
type askedStore struct {
	memStore
	asked [][]string
}

func (s *askedStore) Load(ctx context.Context, workers []string) (map[string]WorkerStats, error) {
	s.asked = append(s.asked, slices.Sorted(slices.Values(workers)))
	return s.memStore.Load(ctx, workers)
}

// Workers join and leave under new names: what the tracker holds, what
// it keeps for its next flush and what Refresh asks the store for return
// to the workers in the fleet, while the store keeps every worker's
// averages, so one that comes back under its name is known at once.
func TestTracker_ForgottenWorkersLeaveMemoryNotTheStore(t *testing.T) {
	ctx := context.Background()
	st := &askedStore{memStore: memStore{m: map[string]WorkerStats{}}}
	tr, err := NewTracker(0.5, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	if err := tr.Track(ctx, "stays"); err != nil {
		t.Fatal(err)
	}
	tr.Observe("stays", Observation{TTFT: 100 * time.Millisecond}, now)
	for i := range 50 {
		name := fmt.Sprintf("pod-%d", i)
		if err := tr.Track(ctx, name); err != nil {
			t.Fatal(err)
		}
		tr.Observe(name, Observation{TTFT: time.Duration(i+1) * time.Second}, now)
		tr.Forget(name)
		if i%10 == 0 {
			if err := tr.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"stays"}, held(tr)); diff != "" {
		t.Fatalf("the tracker holds (-want +got):\n%s", diff)
	}
	tr.mu.Lock()
	parting := len(tr.parting)
	tr.mu.Unlock()
	if parting != 0 {
		t.Fatalf("%d forgotten workers still kept after a flush wrote them", parting)
	}
	st.asked = nil
	if err := tr.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]string{{"stays"}}, st.asked); diff != "" {
		t.Fatalf("Refresh asked the store for (-want +got):\n%s", diff)
	}
	if got, want := len(st.m), 51; got != want {
		t.Fatalf("the store holds %d workers, want all %d ever observed", got, want)
	}
	if err := tr.Track(ctx, "pod-7"); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Get("pod-7").TTFTMs.Value, 8000.0; got != want {
		t.Fatalf("pod-7 back under its name has TTFT %v ms, want the stored %v", got, want)
	}
}

// A worker forgotten before the flush that writes its last observation
// is written all the same, and comes back with it if it rejoins first.
func TestTracker_ForgetBeforeTheFlushLosesNothing(t *testing.T) {
	ctx := context.Background()
	st := &memStore{m: map[string]WorkerStats{}}
	tr, err := NewTracker(0.5, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	tr.Observe("w", Observation{TTFT: time.Second}, now)
	tr.Forget("w")
	if got := tr.Stats("w"); got != nil {
		t.Fatalf("forgotten w still read as %+v", got)
	}
	if err := tr.Track(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Get("w").TTFTMs.N, int64(1); got != want {
		t.Fatalf("w back before the flush has %d samples, want %d", got, want)
	}
	tr.Forget("w")
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := st.m["w"].TTFTMs.N, int64(1); got != want {
		t.Fatalf("the store has %d samples of forgotten w, want %d", got, want)
	}
}
