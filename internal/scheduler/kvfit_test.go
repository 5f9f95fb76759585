package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/snapshot"
)

func TestKVRoom_Estimate(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh := snapshot.Reading{Value: 0.5, Source: "vllm /metrics kv", At: now.Add(-2 * time.Second)}
	stale := snapshot.Reading{Value: 0.9, Source: "vllm /metrics kv", At: now.Add(-time.Minute)}
	for _, tc := range []struct {
		name     string
		snap     snapshot.Snapshot
		own      float64
		prompt   int
		free     int
		reported bool
		fits     bool
	}{
		{name: "unknown capacity always fits", snap: snapshot.Snapshot{KVPressure: stale}, own: 1e6, prompt: 4000, fits: true},
		{name: "idle", snap: snapshot.Snapshot{KVPoolTokens: 8192}, prompt: 8192, free: 8192, fits: true},
		{name: "own requests", snap: snapshot.Snapshot{KVPoolTokens: 8192}, own: 4600, prompt: 4000, free: 3592},
		{name: "own requests, fits", snap: snapshot.Snapshot{KVPoolTokens: 8192}, own: 4600, prompt: 3592, free: 3592, fits: true},
		{name: "own rounds up", snap: snapshot.Snapshot{KVPoolTokens: 100}, own: 10.2, prompt: 90, free: 89},
		{name: "fresh reading above own", snap: snapshot.Snapshot{KVPoolTokens: 8192, KVPressure: fresh}, own: 1000, prompt: 4097, free: 4096, reported: true},
		{name: "own above fresh reading", snap: snapshot.Snapshot{KVPoolTokens: 8192, KVPressure: fresh}, own: 5000, prompt: 3000, free: 3192, fits: true},
		{name: "stale reading ignored", snap: snapshot.Snapshot{KVPoolTokens: 8192, KVPressure: stale}, own: 1000, prompt: 7000, free: 7192, fits: true},
		{name: "more than the cache", snap: snapshot.Snapshot{KVPoolTokens: 8192}, own: 20000, prompt: 1, free: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := kvRoomOf(&tc.snap, tc.own, 1, now, 5*time.Second)
			if r.pool > 0 && (r.free() != tc.free || r.reported != tc.reported) {
				t.Errorf("free %d (reported %v), want %d (%v)", r.free(), r.reported, tc.free, tc.reported)
			}
			if got := r.fits(tc.prompt); got != tc.fits {
				t.Errorf("fits(%d) = %v, want %v", tc.prompt, got, tc.fits)
			}
		})
	}
}

// kvFleet returns two workers, w0 and w1, of 4 slots with the given KV
// pools and readings.
func kvFleet(pools [2]int, kv [2]snapshot.Reading) []WorkerSpec {
	ws := workers(2, 4, "m")
	for i := range ws {
		ws[i].Source = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPoolTokens: pools[i], KVPressure: kv[i]})
	}
	return ws
}

// holdOn admits a request of prompt tokens (and 100 expected output
// tokens) on the named worker and keeps it in flight.
func holdOn(t *testing.T, s *Scheduler, worker string, prompt int) *Lease {
	t.Helper()
	other := map[string]string{"w0": "w1", "w1": "w0"}[worker]
	l := admitNow(t, s, Request{Model: "m", PromptTokens: prompt, MaxTokens: 100, Exclude: []string{other}})
	if l.Worker != worker {
		t.Fatalf("setup request went to %s, want %s", l.Worker, worker)
	}
	return l
}

func TestKVFit_Pick(t *testing.T) {
	now := time.Unix(1000, 0)
	read := func(v float64, age time.Duration) snapshot.Reading {
		return snapshot.Reading{Value: v, Source: "vllm /metrics vllm:kv_cache_usage_perc", At: now.Add(-age)}
	}
	small, big := 8192, 32768
	for _, tc := range []struct {
		name   string
		off    bool   // Config.KVFit false
		policy Policy // "" for Sluice
		pools  [2]int
		kv     [2]snapshot.Reading
		on     [2][]int // prompt tokens in flight on w0, w1
		prompt int
		want   string // the worker bound; "" when held in the queue
		why    string // w0's Why in the record, when passed over
	}{
		{
			// Without the rule w0 wins: one request in flight against two.
			name: "passes over a cache without room", pools: [2]int{small, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 4000, want: "w1",
			why: "prompt of ~4000 tokens does not fit its free KV cache of ~3592 tokens (4600 of 8192 held by Sluice's 1 in flight, prompt + expected output)",
		},
		{name: "prompt that fits stays", pools: [2]int{small, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 3592, want: "w0"},
		{name: "rule off", off: true, pools: [2]int{small, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 4000, want: "w0"},
		{name: "baseline policy", policy: PolicyLeastConnections, pools: [2]int{small, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 4000, want: "w0"},
		{name: "unknown capacity", pools: [2]int{0, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 4000, want: "w0"},
		{name: "unknown prompt size", pools: [2]int{small, big}, on: [2][]int{{4500}, {100, 100}}, prompt: 0, want: "w0"},
		{
			name: "fresh reading of traffic Sluice does not see", pools: [2]int{small, big}, kv: [2]snapshot.Reading{read(0.9, 2*time.Second)},
			on: [2][]int{nil, {100, 100}}, prompt: 4000, want: "w1",
			why: "prompt of ~4000 tokens does not fit its free KV cache of ~819 tokens (7373 of 8192 in use per vllm /metrics vllm:kv_cache_usage_perc, read 2s ago)",
		},
		{name: "stale reading ignored", pools: [2]int{small, big}, kv: [2]snapshot.Reading{read(0.9, time.Minute)}, on: [2][]int{nil, {100, 100}}, prompt: 4000, want: "w0"},
		{name: "none fits: held", pools: [2]int{small, small}, on: [2][]int{{4500}, {4500}}, prompt: 4000, want: ""},
		{
			// A reading alone never holds a request: w0 has nothing of
			// Sluice's in flight to wait for.
			name: "none fits, one without requests of Sluice's", pools: [2]int{small, small}, kv: [2]snapshot.Reading{read(0.9, time.Second)},
			on: [2][]int{nil, {4500}}, prompt: 4000, want: "w0",
		},
		{name: "none fits, baseline", policy: PolicyLeastConnections, pools: [2]int{small, small}, on: [2][]int{{4500}, {4500}}, prompt: 4000, want: "w0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSched(t, Config{MaxQueue: 10, Clock: fixedClock{now}, StaleAfter: 5 * time.Second, KVFit: !tc.off, Policy: tc.policy},
				kvFleet(tc.pools, tc.kv)...)
			var held []*Lease
			for i, name := range []string{"w0", "w1"} {
				for _, p := range tc.on[i] {
					held = append(held, holdOn(t, s, name, p))
				}
			}
			defer func() {
				for _, l := range held {
					l.Release()
				}
			}()
			tk := s.Submit(Request{Model: "m", PromptTokens: tc.prompt, MaxTokens: 100}, nil)
			l, err := tk.Result()
			switch {
			case tc.want == "" && tk.Done():
				t.Fatalf("bound to %v (err %v); want it held in the queue", l, err)
			case tc.want == "":
				return
			case !tk.Done() || err != nil:
				t.Fatalf("not bound: done %v, err %v; want %s", tk.Done(), err, tc.want)
			}
			defer l.Release()
			if l.Worker != tc.want {
				t.Errorf("bound to %s, want %s", l.Worker, tc.want)
			}
			if tc.why == "" || l.Decision == nil {
				return
			}
			c := l.Decision.Explain().Candidates[0]
			if c.Eligible || c.Why != tc.why {
				t.Errorf("w0 in the record: eligible %v, why %q; want passed over, why %q", c.Eligible, c.Why, tc.why)
			}
		})
	}
}

// TestKVFit_HeldHeadHoldsNobodyBack: a request whose prompt no cache has
// room for waits in the queue, a smaller one that arrives behind it takes
// the room there is, and the held one goes when its prompt fits.
func TestKVFit_HeldHeadHoldsNobodyBack(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := workers(1, 4, "m")
	ws[0].Source = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPoolTokens: 8192})
	s := newSched(t, Config{MaxQueue: 10, Clock: fixedClock{now}, KVFit: true}, ws...)
	long := admitNow(t, s, Request{Model: "m", PromptTokens: 4500, MaxTokens: 100}) // 4600 held
	short := admitNow(t, s, Request{Model: "m", PromptTokens: 100, MaxTokens: 100}) // 4800
	head := s.Submit(Request{Model: "m", PromptTokens: 4000, MaxTokens: 100}, nil)
	if head.Done() {
		t.Fatal("a prompt of 4000 tokens was bound with 3392 free; want it held")
	}
	// It arrives behind a waiting request, and goes first: it fits.
	l, err := s.Submit(Request{Model: "m", PromptTokens: 500, MaxTokens: 100}, nil).Result()
	if err != nil || l == nil {
		t.Fatalf("the request behind the held one was not bound: %v", err)
	}
	if r := l.Decision.Explain().Reason; !strings.Contains(r, "bound before an older waiting request") || !strings.Contains(r, "the KV-fit rule held it: its prompt of ~4000 tokens") {
		t.Errorf("reason %q; want it to say it went before the held prompt of ~4000 tokens", r)
	}
	short.Release() // 3792 free: still not enough
	if head.Done() {
		t.Fatal("the head was bound with 3792 free for 4000")
	}
	long.Release() // 7392 free
	h, err := head.Result()
	if !head.Done() || err != nil {
		t.Fatalf("the held request was not bound once its prompt fits: %v", err)
	}
	h.Release()
	l.Release()
}
