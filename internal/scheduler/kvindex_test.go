package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/stats"
)

// With the exact index of KV events the prefix term scores what each
// worker holds, and the record names the events' seq; when a worker's
// events were lost the guess stands and the record says so.
func TestKVIndex_PrefixTermReadsTheEvents(t *testing.T) {
	x := kvevents.NewIndex()
	toks := make([]uint32, 12)
	for i := range toks {
		toks[i] = uint32(i)
	}
	keys := kvevents.BlockKeys(toks, 4)
	x.Apply("w1", kvevents.Batch{Seq: 5, Events: []kvevents.Event{{Kind: kvevents.KindStored,
		BlockHashes: []kvevents.Hash{kvevents.IntHash(1), kvevents.IntHash(2)}, TokenIDs: toks[:8], BlockSize: 4}}})
	x.Apply("w0", kvevents.Batch{Seq: 0, Events: []kvevents.Event{{Kind: kvevents.KindCleared}}})
	s := newSched(t, Config{MaxQueue: 4, KVIndex: x}, workers(2, 4, "m")...)
	l, err := s.Admit(context.Background(), Request{Model: "m", KVBlocks: keys})
	if err != nil || l.Worker != "w1" {
		t.Fatalf("on %v (%v), want w1, which holds 2 of the 3 blocks", l, err)
	}
	if src, raw := prefixTerm(l, "w1"); src != "vLLM KV events, seq 5" || raw < 0.66 || raw > 0.67 {
		t.Errorf("w1's prefix term: %q %v, want the events at seq 5 and 2/3", src, raw)
	}
	l.Release()
	x.Desync("w1", 6)
	l, err = s.Admit(context.Background(), Request{Model: "m", KVBlocks: keys})
	if err != nil {
		t.Fatal(err)
	}
	if src, _ := prefixTerm(l, "w1"); !strings.Contains(src, "guess") || !strings.Contains(src, "lost") {
		t.Errorf("w1's prefix term after a gap: %q, want the guess and why", src)
	}
}

// A prompt sharing its prefix with a request in flight on a worker is
// expected there before the worker publishes the blocks, and the record
// says why; once that request ends only the events count.
func TestKVIndex_BlocksOfARequestInFlightCount(t *testing.T) {
	x := kvevents.NewIndex()
	for _, w := range []string{"w0", "w1"} { // both in sync, holding nothing yet
		x.Apply(w, kvevents.Batch{Seq: 0, Events: []kvevents.Event{{Kind: kvevents.KindCleared}}})
	}
	s := newSched(t, Config{MaxQueue: 4, KVIndex: x}, workers(2, 4, "m")...)
	first, err := s.Admit(context.Background(), Request{Model: "m", KVBlocks: []uint64{11, 12, 13, 14}, Exclude: []string{"w0"}})
	if err != nil || first.Worker != "w1" {
		t.Fatalf("first on %v (%v), want w1", first, err)
	}
	filler, err := s.Admit(context.Background(), Request{Model: "m", Exclude: []string{"w1"}})
	if err != nil || filler.Worker != "w0" {
		t.Fatalf("filler on %v (%v), want w0", filler, err)
	}
	defer filler.Release()
	// The next turn: the first's four blocks and one more, with one
	// request in flight on each worker.
	next, err := s.Admit(context.Background(), Request{Model: "m", KVBlocks: []uint64{11, 12, 13, 14, 15}})
	if err != nil {
		t.Fatal(err)
	}
	if next.Worker != "w1" {
		t.Errorf("next turn on %s, want w1, where the first is in flight", next.Worker)
	}
	if src, raw := prefixTerm(next, "w1"); !strings.Contains(src, "in flight") || raw != 0.8 {
		t.Errorf("w1's prefix term: %q %v, want 4/5 from the request in flight", src, raw)
	}
	if src, raw := prefixTerm(next, "w0"); src != "vLLM KV events, seq 0" || raw != 0 {
		t.Errorf("w0's prefix term: %q %v, want the events' 0", src, raw)
	}
	next.Release()
	first.Release()
	again, err := s.Admit(context.Background(), Request{Model: "m", KVBlocks: []uint64{11, 12, 13, 14, 15}})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if src, raw := prefixTerm(again, "w1"); src != "vLLM KV events, seq 0" || raw != 0 {
		t.Errorf("w1's prefix term after the requests ended: %q %v, want only the events (nothing published)", src, raw)
	}
}

// prefixTerm returns the prefix term's source and raw value for worker w
// in l's decision record.
func prefixTerm(l *Lease, w string) (string, float64) {
	for _, c := range l.Decision.Explain().Candidates {
		if c.Worker == w {
			for _, tm := range c.Terms {
				if tm.Name == "prefix" {
					return tm.Source, tm.Raw
				}
			}
		}
	}
	return "", 0
}

// The record says how many prompt tokens the prediction took as cached on
// the chosen worker: the exact index's match there times the prompt, so
// a benchmark can set the router's expectation against the engine's own
// count.
func TestKVIndex_RecordSaysWhatItExpectedCached(t *testing.T) {
	x := kvevents.NewIndex()
	toks := make([]uint32, 12)
	for i := range toks {
		toks[i] = uint32(i)
	}
	x.Apply("w1", kvevents.Batch{Seq: 5, Events: []kvevents.Event{{Kind: kvevents.KindStored,
		BlockHashes: []kvevents.Hash{kvevents.IntHash(1), kvevents.IntHash(2)}, TokenIDs: toks[:8], BlockSize: 4}}})
	x.Apply("w0", kvevents.Batch{Seq: 0, Events: []kvevents.Event{{Kind: kvevents.KindCleared}}})
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, Config{MaxQueue: 4, KVIndex: x, Stats: tr, Predictor: predict.New(tr)}, workers(2, 4, "m")...)
	l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 12, KVBlocks: kvevents.BlockKeys(toks, 4)})
	if err != nil || l.Worker != "w1" {
		t.Fatalf("on %v (%v), want w1, which holds 2 of the 3 blocks", l, err)
	}
	defer l.Release()
	if p := l.Decision.Promise; p == nil || p.ExpectedCachedTokens != 8 || l.ExpectedCachedTokens() != 8 {
		t.Errorf("record's promise %+v, lease %d: want 8 of the 12 prompt tokens expected cached", p, l.ExpectedCachedTokens())
	}
}

// When the request ends, the worker's own count of cached tokens joins
// the record beside the belief it was placed on, once.
func TestKVIndex_RecordSetsTheBeliefAgainstTheWorkersCount(t *testing.T) {
	x := kvevents.NewIndex()
	toks := make([]uint32, 12)
	for i := range toks {
		toks[i] = uint32(i)
	}
	x.Apply("w1", kvevents.Batch{Seq: 5, Events: []kvevents.Event{{Kind: kvevents.KindStored,
		BlockHashes: []kvevents.Hash{kvevents.IntHash(1), kvevents.IntHash(2)}, TokenIDs: toks[:8], BlockSize: 4}}})
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, Config{MaxQueue: 4, KVIndex: x, Stats: tr, Predictor: predict.New(tr)}, workers(2, 4, "m")...)
	l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 12, KVBlocks: kvevents.BlockKeys(toks, 4)})
	if err != nil || l.Worker != "w1" {
		t.Fatalf("on %v (%v), want w1", l, err)
	}
	if _, ok := l.Decision.PrefixOutcome(); ok {
		t.Fatal("the record has an outcome before the request ended")
	}
	l.Complete(stats.Observation{OutputTokens: 3, CachedTokens: 4, CachedKnown: true}, nil, time.Now())
	got, ok := l.Decision.PrefixOutcome()
	if want := (decisions.PrefixOutcome{ExpectedCachedTokens: 8, CachedTokens: 4}); !ok || got != want {
		t.Fatalf("outcome %+v (%t), want %+v", got, ok, want)
	}
	b, err := l.Decision.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"prefix_outcome":{"expected_cached_tokens":8,"cached_tokens":4}`) {
		t.Errorf("the record's JSON lacks the outcome: %s", b)
	}
	var back decisions.Record
	if err := back.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	if o, ok := back.PrefixOutcome(); !ok || o != got {
		t.Errorf("read back: %+v (%t), want %+v", o, ok, got)
	}
}

// The backlog rules (affinity.go) read the belief the prefix term reads:
// a worker's KV events count there too, not the router's guess alone.
func TestKVIndex_BacklogRulesReadTheSameBelief(t *testing.T) {
	x := kvevents.NewIndex()
	toks := make([]uint32, 12)
	for i := range toks {
		toks[i] = uint32(i)
	}
	x.Apply("w1", kvevents.Batch{Seq: 5, Events: []kvevents.Event{{Kind: kvevents.KindStored,
		BlockHashes: []kvevents.Hash{kvevents.IntHash(1), kvevents.IntHash(2)}, TokenIDs: toks[:8], BlockSize: 4}}})
	s := newSched(t, Config{MaxQueue: 4, KVIndex: x, PrefixIndex: prefix.NewIndex(prefix.Options{})}, workers(2, 4, "m")...)
	req := Request{Model: "m", PromptTokens: 12, Prefix: []uint64{7, 8, 9}, KVBlocks: kvevents.BlockKeys(toks, 4)}
	s.mu.Lock()
	got := []float64{s.matchOnLocked(req, s.byName["w0"]), s.matchOnLocked(req, s.byName["w1"])}
	s.mu.Unlock()
	if got[0] != 0 || got[1] < 0.66 || got[1] > 0.67 {
		t.Errorf("backlog rules' match on w0, w1: %v, want 0 and the events' 2/3", got)
	}
}
