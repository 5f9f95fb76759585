package scheduler

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/stats"
)

// finishTrace is what a run of backlogRun shows of the scheduler's
// learning: each decision's expected output and where it came from, and
// the Retry-After of the refusal at the end, which follows the drain rate.
type finishTrace struct {
	Expected   []int
	Sources    []string
	RetryAfter time.Duration
}

// backlogRun keeps one worker busy with a backlog, ends each lease with
// end after 4 s of (fake) time, and reports what the scheduler learnt.
func backlogRun(t *testing.T, end func(*Lease)) finishTrace {
	t.Helper()
	var mu sync.Mutex
	var recs []*decisions.Record
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := newSched(t, Config{MaxQueue: 3, Clock: clock, QueueTimeout: time.Hour, DefaultOutputTokens: 200, Recorder: func(r *decisions.Record) {
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	}}, workers(1, 1, "m")...)
	req := Request{Model: "m", PromptTokens: 50}
	l, err := s.Submit(req, nil).Result()
	if err != nil {
		t.Fatal(err)
	}
	queued := []*Ticket{s.Submit(req, nil), s.Submit(req, nil)}
	for range 4 {
		clock.t = clock.t.Add(4 * time.Second)
		end(l)
		if l, err = queued[0].Result(); err != nil || l == nil {
			t.Fatalf("queued request not bound when the lease ended: %v", err)
		}
		queued = append(queued[1:], s.Submit(req, nil))
	}
	s.Submit(req, nil) // the queue is full now
	_, err = s.Submit(req, nil).Result()
	var ref *Refusal
	if !errors.As(err, &ref) {
		t.Fatalf("err %v, want a refusal", err)
	}
	var tr finishTrace
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		tr.Expected = append(tr.Expected, r.ExpectedOutputTokens)
		tr.Sources = append(tr.Sources, r.EstimateSource)
	}
	tr.RetryAfter = ref.RetryAfter
	return tr
}

// Complete teaches the output estimate the tokens an answer produced; a
// count of 0 or less is an answer without usage and teaches nothing.
func TestLease_CompleteTeachesTheOutputEstimate(t *testing.T) {
	for _, tt := range []struct {
		name             string
		tokens, expected int
	}{
		{"tokens counted", 80, 80},
		{"one token", 1, 1},
		{"count unknown", 0, 200},
		{"negative", -3, 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := backlogRun(t, func(l *Lease) { l.Complete(stats.Observation{OutputTokens: tt.tokens}, nil, time.Time{}) })
			if n := len(got.Expected); n == 0 || got.Expected[n-1] != tt.expected {
				t.Fatalf("expected outputs %v, want the last %d", got.Expected, tt.expected)
			}
		})
	}
}

// A lease ends once: a Release or Complete after it ended gives nothing
// back and teaches nothing.
func TestLease_EndsOnce(t *testing.T) {
	var mu sync.Mutex
	var recs []*decisions.Record
	s := newSched(t, Config{MaxQueue: 5, DefaultOutputTokens: 200, Recorder: func(r *decisions.Record) {
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	}}, workers(1, 1, "m")...)
	answered := func(n int) stats.Observation { return stats.Observation{OutputTokens: n} }
	a := admitNow(t, s, Request{Model: "m"})
	a.Complete(answered(10), nil, time.Time{})
	b := admitNow(t, s, Request{Model: "m"})   // a's slot is free
	a.Release()                                // no effect: a ended
	a.Complete(answered(10), nil, time.Time{}) // nor this
	c := s.Submit(Request{Model: "m"}, nil)
	if c.Done() {
		l, err := c.Result()
		t.Fatalf("third request placed (lease %v, err %v) while b holds the only slot: a was released twice", l, err)
	}
	b.Release()
	lc, err := c.Result()
	if !c.Done() || err != nil {
		t.Fatalf("queued request not placed when b ended: %v", err)
	}
	lc.Release()
	lc.Complete(answered(999), nil, time.Time{}) // after Release it must teach nothing
	admitNow(t, s, Request{Model: "m"}).Release()
	mu.Lock()
	defer mu.Unlock()
	last := recs[len(recs)-1]
	if got, want := last.ExpectedOutputTokens, 10; got != want {
		t.Fatalf("expected output %d after Complete with 10 and 999 tokens of a released lease, want %d", got, want)
	}
}

// recordingObserver is an Observer that keeps what it was given and, at
// the time, whether the ticket waiting for the slot was already placed.
type recordingObserver struct {
	waiting *Ticket
	worker  string
	o       stats.Observation
	placed  bool
	calls   int
}

func (r *recordingObserver) Observe(worker string, o stats.Observation, now time.Time) {
	r.worker, r.o, r.placed = worker, o, r.waiting.Done()
	r.calls++
}

func TestLease_CompleteObservesBeforeRelease(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := newSched(t, Config{MaxQueue: 5, Clock: clock}, workers(1, 1, "m")...)
	l := admitNow(t, s, Request{Model: "m"})
	obs := &recordingObserver{waiting: s.Submit(Request{Model: "m"}, nil)}
	clock.t = clock.t.Add(2 * time.Second)
	in := stats.Observation{TTFT: time.Second, E2E: 2 * time.Second, OutputTokens: 30, DecodeTPS: 30}
	filed := l.Complete(in, obs, clock.t)
	want := in
	want.Concurrency = 1 // l alone in flight: the queued one was not yet placed
	if diff := cmp.Diff(want, filed); diff != "" {
		t.Fatalf("filed observation (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, obs.o); diff != "" {
		t.Fatalf("observer got (-want +got):\n%s", diff)
	}
	if obs.worker != "w0" || obs.calls != 1 {
		t.Fatalf("observer called %d times for %q, want once for w0", obs.calls, obs.worker)
	}
	if obs.placed {
		t.Fatalf("the slot was given back before the stats were told: the next pick would read stale stats")
	}
	if !obs.waiting.Done() {
		t.Fatalf("queued request not placed after Complete")
	}
	l.Complete(in, nil, clock.t) // a nil observer, on an ended lease: no effect, no panic
	if next := s.Submit(Request{Model: "m"}, nil); next.Done() {
		t.Fatalf("request placed while the queued one holds the only slot: Complete released twice")
	}
}

// BenchmarkLease_End measures ending a lease, with Release and with
// Complete. The leases are made in batches off the clock, so only their
// ends are timed.
func BenchmarkLease_End(b *testing.B) {
	for _, bm := range []struct {
		name string
		end  func(*Lease)
	}{
		{"Release", func(l *Lease) { l.Release() }},
		{"Complete", func(l *Lease) { l.Complete(stats.Observation{OutputTokens: 100}, nil, time.Time{}) }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			s := newSched(b, Config{MaxQueue: 10}, workers(8, 1<<20, "m")...)
			req := Request{Model: "m", PromptTokens: 100}
			leases := make([]*Lease, 0, 1024)
			b.ReportAllocs()
			for n := 0; n < b.N; n += len(leases) {
				b.StopTimer()
				leases = leases[:0]
				for range min(cap(leases), b.N-n) {
					l, err := s.Submit(req, nil).Result()
					if err != nil {
						b.Fatal(err)
					}
					leases = append(leases, l)
				}
				b.StartTimer()
				for _, l := range leases {
					bm.end(l)
				}
			}
		})
	}
}

// A worker that reports finding fewer cached tokens than the index
// expected is believed to hold less afterwards: the next pick expects
// less of the prompts it served before.
func TestComplete_FewerCachedThanExpectedCorrectsTheIndex(t *testing.T) {
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The predictor is what notes the expectation (Lease.ExpectedCachedTokens).
	s := newSched(t, Config{MaxQueue: 4, Stats: tr, Predictor: predict.New(tr),
		PrefixIndex: prefix.NewIndex(prefix.Options{Capacity: 8})}, workers(1, 4, "m")...)
	a := Request{Model: "m", PromptTokens: 4 * prefix.BlockTokens, Prefix: []uint64{1, 2, 3, 4}}
	b := Request{Model: "m", PromptTokens: 4 * prefix.BlockTokens, Prefix: []uint64{5, 6, 7, 8}}
	serve := func(req Request, found int) *Lease {
		l := admitNow(t, s, req)
		l.Complete(stats.Observation{OutputTokens: 1, CachedTokens: found, CachedKnown: true}, nil, time.Time{})
		return l
	}
	serve(a, 0)
	serve(b, 0) // the index is full: a, then b
	if l := serve(a, prefix.BlockTokens); l.ExpectedCachedTokens() != a.PromptTokens {
		t.Fatalf("a expected %d tokens cached, want all %d", l.ExpectedCachedTokens(), a.PromptTokens)
	}
	// The worker found 1 of a's 4 blocks: it evicted 3 the index held, and
	// so holds 3 fewer; b's 3 oldest blocks are no longer believed held.
	if l := serve(b, 4*prefix.BlockTokens); l.ExpectedCachedTokens() != prefix.BlockTokens {
		t.Errorf("b expected %d tokens cached after a's shortfall, want %d (1 of 4 blocks)", l.ExpectedCachedTokens(), prefix.BlockTokens)
	}
}

func TestPrefixBlocks(t *testing.T) {
	for _, tt := range []struct{ blocks, prompt, expected, found, e, f int }{
		{7, 1000, 1000, 896, 7, 7},  // the partial last block is not hashed: a full hit
		{8, 1024, 1024, 1023, 8, 8}, // the one token always computed: a full hit
		{7, 1000, 1000, 384, 7, 3},  // 3 of 7 blocks found
		{7, 1000, 429, 384, 3, 3},   // 3 expected, 3 found
		{10, 4834, 483, 512, 1, 1},  // a hashed partial last block: 1 of 10, found as expected
		{10, 4834, 0, 4833, 0, 9},   // more found than expected counts whole blocks, at most
		{4, 512, 0, 0, 0, 0},
	} {
		e, f := prefixBlocks(tt.blocks, tt.prompt, tt.expected, tt.found)
		if e != tt.e || f != tt.f {
			t.Errorf("prefixBlocks(%d, %d, %d, %d) = %d, %d; want %d, %d", tt.blocks, tt.prompt, tt.expected, tt.found, e, f, tt.e, tt.f)
		}
	}
}
