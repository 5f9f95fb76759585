package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// queued submits req and checks that it waits.
func queued(t *testing.T, s *Scheduler, req Request) *Ticket {
	t.Helper()
	tk := s.Submit(req, nil)
	if tk.Done() {
		l, err := tk.Result()
		t.Fatalf("request for %v did not wait: lease %+v, err %v", req.Prefix, l, err)
	}
	return tk
}

// boundTo checks that tk has been bound to worker and returns its lease.
func boundTo(t *testing.T, tk *Ticket, worker string) *Lease {
	t.Helper()
	if !tk.Done() {
		t.Fatalf("request for %v still waits; want it bound to %s", tk.req.Prefix, worker)
	}
	l, err := tk.Result()
	if err != nil || l.Worker != worker {
		t.Fatalf("request for %v: lease %+v, err %v; want bound to %s", tk.req.Prefix, l, err, worker)
	}
	return l
}

// Two full workers, each holding one conversation, and a queue whose head
// holds its prefix on w1 while the request behind it holds its own on w0.
// When w0 frees, the request whose prefix w0 holds goes first, and the
// head takes w1 when it frees: each turn finds its cache, instead of the
// oldest taking whichever frees first.
func TestAffinity_HolderFirstFromTheQueue(t *testing.T) {
	convA, convB := []uint64{1, 2, 3, 4}, []uint64{5, 6, 7, 8}
	tests := []struct {
		name     string
		gap      time.Duration // between the head's arrival and the next one's
		weight   float64       // weights.prefix
		holderGo bool          // the request behind the head goes first
	}{
		{"holder first", time.Second, 50, true},
		{"within the aging bound", 10 * time.Second, 50, true},
		{"not past the aging bound", 10*time.Second + time.Millisecond, 50, false},
		{"no prefix term, arrival order", time.Second, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.NewManualClock(time.Unix(10000, 0))
			w := DefaultWeights()
			w.Prefix = tt.weight
			s := newSched(t, Config{MaxQueue: 10, Clock: clk, PrefixIndex: prefix.NewIndex(prefix.Options{}), Weights: w,
				MaxOvertake: 10 * time.Second, Limits: limit.Config{Fixed: true}}, workers(2, 1, "m")...)
			a := admitNow(t, s, Request{Model: "m", Prefix: convA})
			b := admitNow(t, s, Request{Model: "m", Prefix: convB})
			if a.Worker != "w0" || b.Worker != "w1" {
				t.Fatalf("conversations on %s and %s, want w0 and w1", a.Worker, b.Worker)
			}
			headB := queued(t, s, Request{Model: "m", Prefix: append(convB[:4:4], 9)})
			clk.Advance(tt.gap)
			nextA := queued(t, s, Request{Model: "m", Prefix: append(convA[:4:4], 10)})
			a.Release() // w0 frees
			if !tt.holderGo {
				boundTo(t, headB, "w0").Release()
				return
			}
			l := boundTo(t, nextA, "w0")
			defer l.Release()
			if headB.Done() {
				t.Fatalf("the head was bound too; want it waiting for w1")
			}
			if r := l.Decision.Explain().Reason; !strings.Contains(r, "bound before an older waiting request") || !strings.Contains(r, "the holder-first rule: w0 is expected to hold 80% of this prompt's prefix against 0%") {
				t.Errorf("reason %q does not say why it went first", r)
			}
			b.Release() // w1 frees
			boundTo(t, headB, "w1").Release()
		})
	}
}

// A worker at its learned limit takes one stream more for a request whose
// prefix it holds, because that request has little to prefill; not two,
// not a request it does not hold, and not while another worker has room.
func TestAffinity_CachedPrefixRunsOneOverTheLearnedLimit(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	now := clk.Now()
	learned1 := learnedOne(now)
	fs := fakeStats{"w0": learned1, "w1": learned1}
	s := newSched(t, Config{MaxQueue: 10, Clock: clk, Stats: fs, PrefixIndex: prefix.NewIndex(prefix.Options{}),
		Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3}}, workers(2, 4, "m")...)
	conv := []uint64{1, 2, 3, 4}
	turn2 := append(conv[:4:4], 5) // 80% cached on the holder
	a := admitNow(t, s, Request{Model: "m", Prefix: conv})
	defer a.Release()
	// w1 has room: another conversation goes there.
	convB := []uint64{20, 21}
	if l := admitNow(t, s, Request{Model: "m", Prefix: convB}); l.Worker != "w1" || l.Limit != 1 {
		t.Fatalf("with w1 idle the request went to %s at limit %d; want w1 at its learned 1", l.Worker, l.Limit)
	} else {
		defer l.Release()
	}
	// Both full at their learned limit: the holder takes one more.
	l := admitNow(t, s, Request{Model: "m", Prefix: turn2})
	defer l.Release()
	if l.Worker != "w0" || l.Limit != 2 {
		t.Fatalf("turn on %s at limit %d; want w0, the holder, at 2 (learned 1, +1 for the cached prefix)", l.Worker, l.Limit)
	}
	if r := l.Decision.Explain().Candidates[0].LimitReason; !strings.Contains(r, "+1 for this request: 80% of its prompt prefix") {
		t.Errorf("limit reason %q does not say why", r)
	}
	// Not a second stream over, and not for a prompt it does not hold.
	again := queued(t, s, Request{Model: "m", Prefix: turn2})
	other := queued(t, s, Request{Model: "m", Prefix: []uint64{7, 8}})
	// Behind them, a request with its prefix on w1 goes at once: the one
	// stream more for a cached prefix passes the waiting head.
	onW1 := s.Submit(Request{Model: "m", Prefix: append(convB[:2:2], 22)}, nil)
	boundTo(t, onW1, "w1").Release()
	if again.Done() || other.Done() {
		t.Fatalf("a request was bound past the limit rule: again %v, other %v", again.Done(), other.Done())
	}
}

// The one stream more for a cached prefix is found behind a head whose
// prompt is too long for the holder: the head's pick does not rule the
// holder out for a shorter prompt.
func TestAffinity_OneOverBehindAHeadTooLongForTheHolder(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	learned1 := learnedOne(clk.Now())
	small := newSource(snapshot.Snapshot{Models: []string{"m"}, ContextTokens: 1000})
	large := newSource(snapshot.Snapshot{Models: []string{"m"}, ContextTokens: 32768})
	s := newSched(t, Config{MaxQueue: 10, Clock: clk, Stats: fakeStats{"small": learned1, "large": learned1},
		PrefixIndex: prefix.NewIndex(prefix.Options{}), Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3}},
		WorkerSpec{Name: "small", MaxConcurrency: 4, Source: small},
		WorkerSpec{Name: "large", MaxConcurrency: 4, Source: large})
	long := admitNow(t, s, Request{Model: "m", PromptTokens: 5000, Prefix: []uint64{20, 21}})
	defer long.Release()
	conv := []uint64{1, 2, 3, 4}
	a := admitNow(t, s, Request{Model: "m", PromptTokens: 500, Prefix: conv})
	defer a.Release()
	if long.Worker != "large" || a.Worker != "small" {
		t.Fatalf("first requests on %s and %s, want large and small", long.Worker, a.Worker)
	}
	head := queued(t, s, Request{Model: "m", PromptTokens: 5000, Prefix: []uint64{30, 31}})
	turn2 := s.Submit(Request{Model: "m", PromptTokens: 600, Prefix: append(conv[:4:4], 5)}, nil)
	boundTo(t, turn2, "small").Release()
	if head.Done() {
		t.Fatalf("the head was bound; want it waiting for large")
	}
}
