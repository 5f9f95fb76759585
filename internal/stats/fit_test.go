package stats

import (
	"context"
	"encoding/json"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/sluice-router/sluice/internal/redistest"
)

func sampleFit() *Fit {
	return &Fit{
		Theta: []float64{1, 200, 13}, P: []float64{1, 0, 0, 0, 1, 0, 0, 0, 1}, Samples: 42,
		TTFTDrift: EMA{Value: 0.1, N: 30}, DecodeDrift: EMA{Value: -0.05, N: 29},
		HoldMs: EMA{Value: 4000, N: 40}, WaitScale: EMA{Value: 0.7, N: 3},
		TTFTErrs: []float64{0.1, 0.05}, DecodeErrs: []float64{0.02},
		Updated: time.Unix(1_700_000_000, 0).UTC(),
	}
}

func TestWorkerStats_FitRoundTripsThroughJSON(t *testing.T) {
	ws := WorkerStats{TTFTMs: EMA{Value: 120, N: 3}, Fit: sampleFit(), Updated: time.Unix(1_700_000_000, 0).UTC()}
	b, err := json.Marshal(ws)
	if err != nil {
		t.Fatal(err)
	}
	var got WorkerStats
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ws, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	// Without a fit the field is left out, so the format of workers with
	// no fit is unchanged.
	b, err = json.Marshal(WorkerStats{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["fit"]; ok {
		t.Fatalf("an empty fit is written: %s", b)
	}
}

// oldEntry is a worker's entry as stats files held it before fits.
const oldEntry = `{"ttft_ms":{"value":250,"n":12},"decode_tps":{"value":41.5,"n":12},` +
	`"output_tokens":{"value":180,"n":12},"e2e_ms":{"value":4600,"n":12},` +
	`"levels":[{"decode_tps":{"value":60,"n":4},"decode_sq":{"value":3610,"n":4},"ttft_ms":{"value":200,"n":4},"updated":"2026-01-02T03:04:05Z"}],` +
	`"updated":"2026-01-02T03:04:05Z"}`

func TestBoltStore_OldEntryWithoutFitLoads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put([]byte("old"), []byte(oldEntry)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err = OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr, err := NewTracker(0.2, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Track(context.Background(), "old"); err != nil {
		t.Fatal(err)
	}
	got := tr.Get("old")
	if got.Fit != nil || got.TTFTMs != (EMA{Value: 250, N: 12}) || got.Level(1).DecodeTPS != (EMA{Value: 60, N: 4}) {
		t.Fatalf("old entry loaded as %+v", got)
	}
}

func TestTracker_SetFitPersists(t *testing.T) {
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
	tr.Observe("w", Observation{TTFT: 100 * time.Millisecond, DecodeTPS: 50, Concurrency: 1}, now)
	tr.SetFit("w", sampleFit(), now.Add(time.Second))
	tr.SetFit("new", sampleFit(), now) // a worker seen first through its fit
	if got := tr.Get("w"); got.Fit == nil || got.TTFTMs.N != 1 || !got.Updated.Equal(now.Add(time.Second)) {
		t.Fatalf("after SetFit: %+v", got)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := tr.All()
	s.Close()
	s2, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.Load(context.Background(), []string{"w", "new"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("reloaded (-want +got):\n%s", diff)
	}
}

// memStore is a Store in memory, for Refresh.
type memStore struct{ m map[string]WorkerStats }

func (s *memStore) Load(_ context.Context, workers []string) (map[string]WorkerStats, error) {
	return only(s.m, workers), nil
}
func (s *memStore) Save(_ context.Context, e map[string]WorkerStats) error {
	maps.Copy(s.m, e)
	return nil
}
func (s *memStore) Close() error { return nil }

func TestTracker_RefreshKeepsTheLocalFit(t *testing.T) {
	st := &memStore{m: map[string]WorkerStats{}}
	tr, err := NewTracker(0.2, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	f := sampleFit()
	tr.SetFit("w", f, now)
	// Another writer of the store, which knows no fit.
	st.m["w"] = WorkerStats{TTFTMs: EMA{Value: 300, N: 9}, Updated: now}
	if err := tr.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := tr.Get("w")
	if got.TTFTMs.N != 9 || got.Fit != f {
		t.Fatalf("after Refresh: %+v, want the store's averages and the local fit", got)
	}
	// A fit in the store does not replace this replica's own, fresher
	// one; a replica with none adopts it.
	other := sampleFit()
	st.m["w"] = WorkerStats{Fit: other}
	if err := tr.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tr.Get("w"); got.Fit != f {
		t.Fatalf("the stored fit replaced the local one")
	}
	fresh, err := NewTracker(0.2, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Track(context.Background(), "w"); err != nil {
		t.Fatal(err)
	}
	if got := fresh.Get("w"); got.Fit == nil || got.Fit.Samples != other.Samples {
		t.Fatalf("a fresh tracker did not adopt the stored fit: %+v", got.Fit)
	}
}

func TestRedisStore_FitSurvivesARestartAndFoldsKeepIt(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	tr := newRedisTracker(t, openRedisStore(t, srv.URL(4), ""))
	now := time.Unix(1_700_000_500, 0).UTC()
	tr.Observe("w", obs(1), now)
	f := sampleFit()
	tr.SetFit("w", f, now)
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tr.Get("w"); got.Fit != f || got.TTFTMs.N != 1 {
		t.Fatalf("after the fold: %+v", got)
	}
	// Another replica folds observations; the stored fit stays.
	other := newRedisTracker(t, openRedisStore(t, srv.URL(4), ""))
	other.Observe("w", obs(2), now)
	if err := other.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	again := newRedisTracker(t, openRedisStore(t, srv.URL(4), ""), "w")
	got := again.Get("w")
	if got.TTFTMs.N != 2 {
		t.Fatalf("samples %d, want both replicas' 2", got.TTFTMs.N)
	}
	if diff := cmp.Diff(f, got.Fit); diff != "" {
		t.Fatalf("fit after a restart (-want +got):\n%s", diff)
	}
}
