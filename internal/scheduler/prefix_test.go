package scheduler

import (
	"encoding/json"
	"math"
	"regexp"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
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
	got := []float64{0}
	if idx.MatchSources("m", turn2, []string{"w0"}, got, []bool{false}); got[0] != 1 {
		t.Errorf("after binding turn 2, the match on w0 = %v, want 1", got[0])
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

// countingIndex counts the index's lookups.
type countingIndex struct {
	*prefix.Index
	matches int
}

func (c *countingIndex) MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool) {
	c.matches++
	c.Index.MatchSources(model, hashes, workers, frac, remote)
}

// With weights.prefix 0 the term counts for nothing, so no pick asks the
// index (it is on the hot path), and the record's prefix term is 0.
func TestPrefix_WeightZeroIgnoresIndex(t *testing.T) {
	idx := &countingIndex{Index: prefix.NewIndex(prefix.Options{})}
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
	if got := termOf(t, l.Decision.Explain().Candidates[0], "prefix"); got.Raw != 0 || got.Weighted != 0 {
		t.Errorf("w0's prefix term: %+v; want 0: the index was not asked", got)
	}
	if idx.matches != 0 {
		t.Errorf("the index was asked %d times with the prefix weight 0", idx.matches)
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

// reporting returns workers whose snapshots carry the given cache reports
// (nil: none) and KV cache sizes.
func reporting(reps []*snapshot.CacheReport, kv int) []WorkerSpec {
	ws := workers(len(reps), 4, "m")
	for i := range ws {
		ws[i].Source = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, CacheReport: reps[i], KVCacheTokens: kv})
	}
	return ws
}

func blocks(hs ...uint64) map[uint64]struct{} {
	m := map[uint64]struct{}{}
	for _, h := range hs {
		m[h] = struct{}{}
	}
	return m
}

func TestPrefix_WorkerReport(t *testing.T) {
	t0 := time.Unix(10000, 0)
	conv := []uint64{11, 12, 13, 14}
	tests := []struct {
		name       string
		reps       []*snapshot.CacheReport
		seed       string // worker the index saw conv go to; "" none
		wantWorker string
		wantRaw    float64 // the chosen worker's prefix term
		wantSource string
		wantAgeMs  float64
	}{
		{
			// The index knows nothing (say, the router restarted); w1
			// says it holds three of the four blocks.
			name:       "report beats an empty index",
			reps:       []*snapshot.CacheReport{nil, {Source: "llama.cpp /slots", At: t0.Add(-1500 * time.Millisecond), Blocks: blocks(11, 12, 13, 99)}},
			wantWorker: "w1", wantRaw: 0.75,
			wantSource: "worker report (llama.cpp /slots, 1.5s old)", wantAgeMs: 1500,
		},
		{
			// w0 served conv; its report holds other prompts. Silence is
			// not evidence (a chat template, --cache-ram): the guess stays.
			name:       "report silent, guess kept",
			reps:       []*snapshot.CacheReport{{Source: "llama.cpp /slots", At: t0.Add(-time.Second), Blocks: blocks(7, 8)}, nil},
			seed:       "w0",
			wantWorker: "w0", wantRaw: 1,
			wantSource: "router index (guess); llama.cpp /slots report 1s old holds 0.00",
		},
		{
			// w1's report would win, but it is older than stale_after.
			name:       "stale report set aside",
			reps:       []*snapshot.CacheReport{nil, {Source: "llama.cpp /slots", At: t0.Add(-10 * time.Second), Blocks: blocks(11, 12, 13, 14)}},
			wantWorker: "w0", wantRaw: 0,
			wantSource: "router index (guess)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.NewManualClock(t0)
			idx := prefix.NewIndex(prefix.Options{Now: clk.Now})
			if tt.seed != "" {
				idx.Record("m", conv, tt.seed)
			}
			s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx, Clock: clk, StaleAfter: 3 * time.Second}, reporting(tt.reps, 0)...)
			l := admitNow(t, s, Request{Model: "m", Prefix: conv})
			defer l.Release()
			if l.Worker != tt.wantWorker {
				t.Fatalf("went to %s, want %s", l.Worker, tt.wantWorker)
			}
			var got decisions.Term
			for _, c := range l.Decision.Explain().Candidates {
				if c.Worker == tt.wantWorker {
					got = termOf(t, c, "prefix")
				}
			}
			if got.Raw != tt.wantRaw || got.Source != tt.wantSource || got.AgeMs != tt.wantAgeMs {
				t.Errorf("prefix term %+v; want raw %v, source %q, age %v ms", got, tt.wantRaw, tt.wantSource, tt.wantAgeMs)
			}
		})
	}

	// The stale case's record names the report it set aside.
	clk := clocktest.NewManualClock(t0)
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: prefix.NewIndex(prefix.Options{Now: clk.Now}), Clock: clk, StaleAfter: 3 * time.Second},
		reporting(tests[2].reps, 0)...)
	l := admitNow(t, s, Request{Model: "m", Prefix: conv})
	defer l.Release()
	for _, c := range l.Decision.Explain().Candidates {
		if c.Worker == "w1" {
			if got, want := termOf(t, c, "prefix").Source, "router index (guess); llama.cpp /slots report 10s old, stale"; got != want {
				t.Errorf("w1's prefix source %q, want %q", got, want)
			}
		}
	}
}

func TestPrefix_IndexSizedFromReportedKV(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx}, reporting([]*snapshot.CacheReport{nil}, 3*prefix.BlockTokens)...)
	admitNow(t, s, Request{Model: "m", Prefix: []uint64{1, 2, 3, 4, 5}}).Release()
	if got := idx.Capacity("w0"); got != 3 {
		t.Errorf("index capacity of w0 = %d, want 3 blocks from its 3-block KV cache", got)
	}
	if got := idx.Len("m", "w0"); got != 3 {
		t.Errorf("index remembers %d blocks of w0, want 3", got)
	}
}

// A reward term that contributes nothing (a prefix miss: its weight is
// negative, its value 0) is recorded as weighted 0, not -0: the JSON of a
// decision reads "weighted":0.
func TestExplain_RecordsNoNegativeZero(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx}, workers(2, 4, "m")...)
	conv := []uint64{11, 12, 13, 14}
	admitNow(t, s, Request{Model: "m", Prefix: conv}).Release()
	l := admitNow(t, s, Request{Model: "m", Prefix: append(conv[:4:4], 15)})
	defer l.Release()
	r := l.Decision.Explain()
	for _, c := range r.Candidates {
		for _, term := range c.Terms {
			if math.Signbit(term.Weighted) && term.Weighted == 0 {
				t.Errorf("%s's %s term is weighted -0: %+v", c.Worker, term.Name, term)
			}
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if negZero := regexp.MustCompile(`":-0[,}]`); negZero.Match(b) {
		t.Errorf("the record's JSON holds -0: %s", negZero.FindAll(b, -1))
	}
}
