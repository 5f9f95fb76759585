package stats

import (
	"context"
	"errors"
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
	tr, err := NewTracker(context.Background(), 0.5, nil, nil)
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
		if _, err := NewTracker(context.Background(), a, nil, nil); err == nil {
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
	tr, err := NewTracker(context.Background(), 0.2, s, nil)
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
	tr2, err := NewTracker(context.Background(), 0.2, s2, nil)
	if err != nil {
		t.Fatal(err)
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

func (f *failingStore) Load(context.Context) (map[string]WorkerStats, error) {
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

func TestTracker_FailedFlushIsRetried(t *testing.T) {
	st := &failingStore{}
	tr, _ := NewTracker(context.Background(), 0.2, st, nil)
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
