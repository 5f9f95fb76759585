package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A request that names the kinds that may serve it never goes to a worker
// of another kind, even the idlest one, the record says why; and when no
// worker of those kinds is left it is refused at once rather than queued.
func TestKindFilter_OnlyTheNamedKindsServe(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 4},
		WorkerSpec{Name: "tgi", Models: []string{"m"}, MaxConcurrency: 4, Kind: "tgi"},
		WorkerSpec{Name: "llama", Models: []string{"m"}, MaxConcurrency: 4, Kind: "llamacpp"})
	ctx := context.Background()
	busy, err := s.Admit(ctx, Request{Model: "m"})
	if err != nil || busy.Worker != "tgi" {
		t.Fatalf("first request on %v (%v), want tgi, listed first", busy, err)
	}
	// llama is now the idler one; a continuation wanting llamacpp or vllm
	// goes there whatever the load, and twice.
	for range 2 {
		l, err := s.Admit(ctx, Request{Model: "m", Kinds: []string{"llamacpp", "vllm"}})
		if err != nil || l.Worker != "llama" {
			t.Fatalf("continuation on %v (%v), want llama", l, err)
		}
		var why string
		for _, c := range l.Decision.Explain().Candidates {
			if c.Worker == "tgi" {
				why = c.Why
			}
		}
		if !strings.Contains(why, "kind cannot serve") {
			t.Errorf("record says of tgi %q, want its kind named as the reason", why)
		}
	}
	_, err = s.Admit(ctx, Request{Model: "m", Kinds: []string{"llamacpp"}, Exclude: []string{"llama"}})
	if !errors.Is(err, ErrNoHealthyWorker) {
		t.Fatalf("with only a tgi worker left: %v, want ErrNoHealthyWorker at once", err)
	}
	if l, err := s.Admit(ctx, Request{Model: "m"}); err != nil || l.Worker != "tgi" {
		t.Fatalf("a request naming no kinds on %v (%v), want tgi", l, err)
	}
}
