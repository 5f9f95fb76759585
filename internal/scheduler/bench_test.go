package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// BenchmarkPick measures one admission at n idle workers — score every
// worker, reserve the winner, release — with the decision record built
// (as the router does) and without it (as virtual-time runs do).
// "default" is the router as shipped: learned limits (MinSamples 3 is
// the default, set only so newSched does not fix the limits), default
// weights, max_concurrency auto, and the prefix index asked about a
// prompt of eight blocks.
func BenchmarkPick(b *testing.B) {
	for _, mode := range []struct {
		records bool
		limits  limit.Config
		def     bool // max_concurrency auto, a prefix index and hashes
		name    string
	}{
		{true, limit.Config{Fixed: true}, false, "records=true"},
		{false, limit.Config{Fixed: true}, false, "records=false"},
		{true, limit.Config{MinSamples: 3}, false, "records=true/limits=auto"},
		{true, limit.Config{MinSamples: 3}, true, "records=true/default"},
	} {
		records := mode.records
		for _, n := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("%s/workers=%d", mode.name, n), func(b *testing.B) {
				st, _ := stats.NewTracker(0.2, nil, nil)
				limit := 1 << 30
				if mode.def {
					limit = 0
				}
				ws := workers(n, limit, "m")
				for i := range ws {
					ws[i].Source = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPressure: snapshot.Reading{Value: float64(i%10) / 10, At: time.Now()}})
					st.Observe(ws[i].Name, stats.Observation{TTFT: time.Duration(100+i) * time.Millisecond, OutputTokens: 100, DecodeTPS: float64(50 + i%7)}, time.Now())
				}
				cfg := Config{MaxQueue: 5, Stats: st, NoRecords: !records, Limits: mode.limits}
				req := Request{Model: "m", PromptTokens: 100}
				if mode.def {
					cfg.PrefixIndex = prefix.NewIndex(prefix.Options{})
					req.Prefix = []uint64{1, 2, 3, 4, 5, 6, 7, 8}
				}
				s := newSched(b, cfg, ws...)
				b.ReportAllocs()
				for b.Loop() {
					l, err := s.Admit(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					l.Release()
				}
			})
		}
	}
}

// BenchmarkQueueWhileFull measures a request arriving when every worker is
// busy: it must queue without building a decision record nobody reads.
func BenchmarkQueueWhileFull(b *testing.B) {
	for _, n := range []int{64, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			s := newSched(b, Config{MaxQueue: 1 << 30}, workers(n, 1, "m")...) // never full: each iteration adds one
			for range n {
				s.Submit(Request{Model: "m"}, nil)
			}
			b.ReportAllocs()
			for b.Loop() {
				t := s.Submit(Request{Model: "m"}, nil)
				if t.Done() {
					b.Fatal("bound while every worker is full")
				}
			}
		})
	}
}

// BenchmarkQueueWhileFullPrefix is BenchmarkQueueWhileFull with what the
// default router has under a backlog: learned limits below each worker's
// cap, a prefix index and prompt hashes that miss everywhere, so that each
// arrival also looks behind the head for a request that could run one
// stream over a holder's learned limit (affinity.go), within its budget.
func BenchmarkQueueWhileFullPrefix(b *testing.B) {
	for _, n := range []int{64, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			now := time.Now()
			fs := storedStats{}
			ws := workers(n, 4, "m")
			for _, w := range ws {
				fs[w.Name] = ptr(learnedOne(now)) // learned 1 of 4
			}
			s := newSched(b, Config{MaxQueue: 1 << 30, NoRecords: true, Stats: fs, PrefixIndex: prefix.NewIndex(prefix.Options{}),
				Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3}}, ws...)
			for i := range n + 64 {
				s.Submit(Request{Model: "m", Prefix: []uint64{uint64(i), 1, 2, 3}}, nil)
			}
			b.ReportAllocs()
			i := uint64(1 << 20)
			for b.Loop() {
				i++
				t := s.Submit(Request{Model: "m", Prefix: []uint64{i, 1, 2, 3}}, nil)
				if t.Done() {
					b.Fatal("bound while every worker is full")
				}
			}
		})
	}
}

// storedStats returns the stats it holds, as the stats tracker does,
// without fakeStats' copy per call, which would dominate what a benchmark
// measures.
type storedStats map[string]*stats.WorkerStats

func (f storedStats) Stats(w string) *stats.WorkerStats { return f[w] }
