package scheduler

import (
	"testing"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/prefix"
)

// termOf returns the named term of a candidate's breakdown.
func termOf(t *testing.T, c decisions.Candidate, name string) decisions.Term {
	t.Helper()
	for _, term := range c.Terms {
		if term.Name == name {
			return term
		}
	}
	t.Fatalf("candidate %s has no %q term: %+v", c.Worker, name, c.Terms)
	return decisions.Term{}
}

func admitNow(t *testing.T, s *Scheduler, req Request) *Lease {
	t.Helper()
	tk := s.Submit(req, nil)
	l, err := tk.Result()
	if !tk.Done() || err != nil {
		t.Fatalf("request for %v not bound at once: done %v, err %v", req.Prefix, tk.Done(), err)
	}
	return l
}

func TestPrefix_HitWinsAmongEquallyLoaded(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx}, workers(2, 4, "m")...)
	conv := []uint64{11, 12, 13, 14}
	admitNow(t, s, Request{Model: "m", Prefix: conv}).Release() // w0: first listed
	// Without the prefix term the next request would go to w1, the least
	// recently picked; turn 2 of the conversation goes back to w0.
	turn2 := append(conv[:4:4], 15, 16, 17, 18)
	l := admitNow(t, s, Request{Model: "m", Prefix: turn2})
	if l.Worker != "w0" {
		t.Fatalf("turn 2 went to %s, want w0 which served turn 1", l.Worker)
	}
	r := l.Decision.Explain()
	hit := termOf(t, r.Candidates[0], "prefix")
	if hit.Raw != 0.5 || hit.Weighted != -25 || hit.Source != "router index (guess)" {
		t.Errorf("w0's prefix term: %+v; want raw 0.5 (4 of 8 blocks), weighted -25, source router index (guess)", hit)
	}
	if miss := termOf(t, r.Candidates[1], "prefix"); miss.Raw != 0 || miss.Weighted != 0 {
		t.Errorf("w1's prefix term: %+v; want 0", miss)
	}
	l.Release()
	// The index learnt turn 2 on w0.
	if got := idx.Match("m", turn2, "w0"); got != 1 {
		t.Errorf("after binding turn 2, Match on w0 = %v, want 1", got)
	}
}

// TestPrefix_NoHerding shows the rule in the prefixMatch doc: a full hit
// on a worker with a request in flight loses to a miss on an idle worker.
func TestPrefix_NoHerding(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx}, workers(2, 4, "m")...)
	conv := []uint64{1, 2, 3}
	busy := admitNow(t, s, Request{Model: "m", Prefix: conv}) // w0 holds it, and is busy
	defer busy.Release()
	l := admitNow(t, s, Request{Model: "m", Prefix: conv})
	defer l.Release()
	if l.Worker != "w1" {
		t.Fatalf("the same prefix went to %s, busy; want idle w1", l.Worker)
	}
	r := l.Decision.Explain()
	w0, w1 := r.Candidates[0], r.Candidates[1]
	if got := termOf(t, w0, "prefix"); got.Raw != 1 || got.Weighted != -50 {
		t.Errorf("w0's prefix term: %+v; want a full hit weighted -50", got)
	}
	if got := termOf(t, w0, "active_requests"); got.Weighted != 100 {
		t.Errorf("w0's active_requests term: %+v; want 100", got)
	}
	if !(w0.Total > w1.Total) {
		t.Errorf("totals: busy hit %v, idle miss %v; want the idle miss lower", w0.Total, w1.Total)
	}
}

func TestPrefix_WeightZeroIgnoresIndex(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	w := DefaultWeights()
	w.Prefix = 0
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx, Weights: w}, workers(2, 4, "m")...)
	conv := []uint64{1, 2, 3}
	admitNow(t, s, Request{Model: "m", Prefix: conv}).Release()
	l := admitNow(t, s, Request{Model: "m", Prefix: conv})
	defer l.Release()
	if l.Worker != "w1" {
		t.Fatalf("with weights.prefix 0 the request went to %s; want w1, the least recently picked", l.Worker)
	}
	if got := termOf(t, l.Decision.Explain().Candidates[0], "prefix"); got.Raw != 1 || got.Weighted != 0 {
		t.Errorf("w0's prefix term: %+v; want raw 1 recorded, weighted 0", got)
	}
}

func TestPrefix_BaselinesDoNotAsk(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{PrefixIndex: idx, Policy: PolicyLeastConnections}, workers(2, 4, "m")...)
	admitNow(t, s, Request{Model: "m", Prefix: []uint64{1}}).Release()
	l := admitNow(t, s, Request{Model: "m", Prefix: []uint64{1}})
	defer l.Release()
	if l.Worker != "w1" {
		t.Fatalf("least-connections sent the second request to %s; want w1 (least recently picked)", l.Worker)
	}
}
