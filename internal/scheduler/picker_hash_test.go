package scheduler

import (
	"context"
	"testing"
)

// TestConsistentHash_SamePrefixSameWorkerUntilTheBound sends requests
// whose prompts share a first block to one worker, until that worker is
// at the load bound; then the next goes on along the ring.
func TestConsistentHash_SamePrefixSameWorkerUntilTheBound(t *testing.T) {
	s := newSched(t, Config{Policy: PolicyConsistentHash, HashLoadBound: 1.25}, workers(2, 8, "m")...)
	admit := func(first uint64) *Lease {
		t.Helper()
		l, err := s.Admit(context.Background(), Request{Model: "m", Prefix: []uint64{first, first ^ 7}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a := admit(42)
	b := admit(42)
	if a.Worker != b.Worker {
		t.Fatalf("two prompts with one first block went to %s and %s", a.Worker, b.Worker)
	}
	// The bound was ceil(1.25 × 2 / 2) = 2 for the second; for a third
	// it is ceil(1.25 × 3 / 2) = 2, the holder's load: it goes on.
	c := admit(42)
	if c.Worker == a.Worker {
		t.Fatalf("a third request went to %s above the load bound", c.Worker)
	}
	a.Release()
	b.Release()
	c.Release()
	if d := admit(42); d.Worker != a.Worker {
		t.Fatalf("with the holder free again the prompt went to %s, want %s", d.Worker, a.Worker)
	}
}

// TestConsistentHash_SpreadsDistinctPrefixes puts distinct first blocks
// on every worker, and the same key on the same worker in a new
// scheduler: the ring depends on the workers' names only.
func TestConsistentHash_SpreadsDistinctPrefixes(t *testing.T) {
	place := func() []string {
		s := newSched(t, Config{Policy: PolicyConsistentHash}, workers(4, 1000, "m")...)
		var out []string
		for k := range uint64(200) {
			l, err := s.Admit(context.Background(), Request{Model: "m", Prefix: []uint64{k * 0x9e3779b97f4a7c15}})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l.Worker)
			l.Release() // no load: placement by hash alone
		}
		return out
	}
	first, again := place(), place()
	count := map[string]int{}
	for i, w := range first {
		count[w]++
		if again[i] != w {
			t.Fatalf("key %d went to %s, then to %s in a scheduler with the same workers", i, w, again[i])
		}
	}
	for _, w := range []string{"w0", "w1", "w2", "w3"} {
		if got := count[w]; got < 25 || got > 75 {
			t.Fatalf("%s took %d of 200 distinct prefixes, want about 50 (%v)", w, got, count)
		}
	}
}

// TestConsistentHash_NoPromptGoesToTheLeastBusy sends a request with no
// prefix to the worker with the fewest requests in flight.
func TestConsistentHash_NoPromptGoesToTheLeastBusy(t *testing.T) {
	s := newSched(t, Config{Policy: PolicyConsistentHash}, workers(2, 8, "m")...)
	a, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Worker == b.Worker {
		t.Fatalf("two requests without a prompt both went to %s", a.Worker)
	}
}

func TestConsistentHash_BoundBelowOneIsRefused(t *testing.T) {
	if _, err := New(Config{Policy: PolicyConsistentHash, HashLoadBound: 0.5}, workers(2, 1, "m")...); err == nil {
		t.Fatal("a load bound of 0.5 was accepted")
	}
}
