package scheduler

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

func TestScheduler_ScoreTerms(t *testing.T) {
	tests := []struct {
		name  string
		snaps map[string]snapshot.Snapshot
		stats fakeStats
		want  string
	}{
		{"kv pressure", map[string]snapshot.Snapshot{"w0": {KVPressure: snapshot.Reading{Value: 0.9, At: time.Now()}}, "w1": {KVPressure: snapshot.Reading{Value: 0.2, At: time.Now()}}}, nil, "w1"},
		{"gpu util", map[string]snapshot.Snapshot{"w0": {GPUUtil: snapshot.Reading{Value: 0.8, At: time.Now()}}, "w1": {GPUUtil: snapshot.Reading{Value: 0.1, At: time.Now()}}}, nil, "w1"},
		{"worker queue", map[string]snapshot.Snapshot{"w0": {QueueLen: snapshot.Reading{Value: 2, At: time.Now()}}, "w1": {QueueLen: snapshot.Reading{Value: 0, At: time.Now()}}}, nil, "w1"},
		{"throughput reward", nil, fakeStats{"w0": {DecodeTPS: stats.EMA{Value: 40, N: 5}}, "w1": {DecodeTPS: stats.EMA{Value: 80, N: 5}}}, "w1"},
		{"latency", nil, fakeStats{"w0": {TTFTMs: stats.EMA{Value: 900, N: 5}}, "w1": {TTFTMs: stats.EMA{Value: 100, N: 5}}}, "w1"},
		{"tie goes to first listed", nil, nil, "w0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ws []WorkerSpec
			for _, n := range []string{"w0", "w1"} {
				ws = append(ws, WorkerSpec{Name: n, Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(tt.snaps[n])})
			}
			s := newSched(t, Config{MaxQueue: 5, Stats: tt.stats}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != tt.want {
				t.Fatalf("picked %s, want %s; reason %q", l.Worker, tt.want, l.Decision.Reason)
			}
		})
	}
}

func TestScheduler_NeutralValueForNoHistory(t *testing.T) {
	st := fakeStats{"w0": {DecodeTPS: stats.EMA{Value: 50, N: 3}}, "w1": {DecodeTPS: stats.EMA{Value: 100, N: 3}}}
	s := newSched(t, Config{MaxQueue: 5, Stats: st}, workers(3, 1, "m")...)
	l, _ := s.Admit(context.Background(), Request{Model: "m"})
	norms := map[string]float64{}
	for _, c := range l.Decision.Explain().Candidates {
		for _, term := range c.Terms {
			if term.Name == "throughput" {
				norms[c.Worker] = term.Norm
				if c.Worker == "w2" && !term.Neutral {
					t.Error("w2 has no history but its term is not marked neutral")
				}
			}
		}
	}
	if got, want := norms["w2"], 0.75; got != want {
		t.Fatalf("no-history norm %v, want %v (mean of 0.5 and 1)", got, want)
	}
	if norms["w2"] <= norms["w0"] || norms["w2"] >= norms["w1"] {
		t.Fatalf("no-history norm %v not between worst %v and best %v", norms["w2"], norms["w0"], norms["w1"])
	}
}

func TestScheduler_DecisionRecordExplainsEveryWorker(t *testing.T) {
	var recs []*decisions.Record
	down := newSource(snapshot.Snapshot{Health: snapshot.HealthDown, HealthReason: "probe failed"})
	ws := []WorkerSpec{
		{Name: "a", Models: []string{"m"}, MaxConcurrency: 1},
		{Name: "b", Models: []string{"m"}, Source: down},
		{Name: "c", Models: []string{"x"}},
	}
	s := newSched(t, Config{MaxQueue: 5, Recorder: func(r *decisions.Record) { recs = append(recs, r) }}, ws...)
	l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 100, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0] != l.Decision {
		t.Fatalf("recorded %d records; want the lease's decision once", len(recs))
	}
	r := recs[0].Explain()
	if r.Chosen != "a" || r.Outcome != "bound" || len(r.Candidates) != 3 {
		t.Fatalf("record %+v", r)
	}
	if got := r.Candidates[1].Why; got != "unhealthy: probe failed" {
		t.Errorf("b why %q", got)
	}
	if got := r.Candidates[2].Why; got != `does not serve model "m"` {
		t.Errorf("c why %q", got)
	}
	if n := len(r.Candidates[0].Terms); n != 8 {
		t.Fatalf("chosen has %d terms, want 8", n)
	}
	sum := 0.0
	for _, term := range r.Candidates[0].Terms {
		if term.Weighted != term.Weight*term.Norm {
			t.Errorf("term %s weighted %v != weight %v * norm %v", term.Name, term.Weighted, term.Weight, term.Norm)
		}
		sum += term.Weighted
	}
	if sum != r.Candidates[0].Total {
		t.Errorf("terms sum %v != total %v", sum, r.Candidates[0].Total)
	}
	if got := s.Workers()[0].JobCost; got != 150 {
		t.Errorf("job cost %v, want prompt 100 + min(max_tokens 50, default 256)", got)
	}
}

func TestScheduler_StaleTelemetryIsMarked(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	src := newSource(snapshot.Snapshot{KVPressure: snapshot.Reading{Value: 0.5, Source: "test", At: clock.t.Add(-10 * time.Second)}})
	s := newSched(t, Config{MaxQueue: 5, Clock: clock, StaleAfter: 3 * time.Second}, WorkerSpec{Name: "a", Models: []string{"m"}, Source: src})
	l, _ := s.Admit(context.Background(), Request{Model: "m"})
	for _, term := range l.Decision.Explain().Candidates[0].Terms {
		if term.Name == "kv_pressure" {
			if !term.Stale || term.AgeMs != 10000 {
				t.Fatalf("kv term %+v, want stale with age 10000ms", term)
			}
			return
		}
	}
	t.Fatal("no kv_pressure term")
}

func TestScheduler_NoRecordsPicksTheSame(t *testing.T) {
	run := func(noRecords bool) []string {
		st := fakeStats{"w1": {DecodeTPS: stats.EMA{Value: 80, N: 3}}, "w2": {TTFTMs: stats.EMA{Value: 900, N: 3}}}
		s := newSched(t, Config{MaxQueue: 100, Stats: st, NoRecords: noRecords}, workers(4, 2, "m")...)
		var got []string
		var held []*Lease
		for i := range 20 {
			tk := s.Submit(Request{Model: "m", PromptTokens: 10 * i}, nil)
			if l, err := tk.Result(); err == nil && l != nil {
				got = append(got, l.Worker)
				held = append(held, l)
				if (l.Decision == nil) != noRecords {
					t.Fatalf("noRecords=%v but lease decision %v", noRecords, l.Decision)
				}
			}
			if i%3 == 2 && len(held) > 0 {
				held[0].Release()
				held = held[1:]
			}
		}
		return got
	}
	if a, b := run(false), run(true); !slices.Equal(a, b) {
		t.Fatalf("with records %v, without %v", a, b)
	}
	if _, err := New(Config{NoRecords: true, Recorder: func(*decisions.Record) {}}); err == nil {
		t.Fatal("NoRecords with a Recorder accepted")
	}
}

// A worker that reports no telemetry (an openai-kind worker, a broken
// /metrics) must not look idle: it is neutral, between the best and the
// worst of those that report.
func TestScheduler_UnknownTelemetryIsNeutral(t *testing.T) {
	now := time.Now()
	for _, term := range []string{"kv_pressure", "gpu_util", "queue_length"} {
		t.Run(term, func(t *testing.T) {
			read := func(v float64) snapshot.Snapshot {
				r := snapshot.Reading{Value: v, At: now, Source: "test"}
				switch term {
				case "kv_pressure":
					return snapshot.Snapshot{KVPressure: r}
				case "gpu_util":
					return snapshot.Snapshot{GPUUtil: r}
				}
				r.Value *= 4
				return snapshot.Snapshot{QueueLen: r}
			}
			ws := []WorkerSpec{
				{Name: "silent", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(snapshot.Snapshot{})},
				{Name: "busy", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(read(0.9))},
				{Name: "quiet", Models: []string{"m"}, MaxConcurrency: 4, Source: newSource(read(0.1))},
			}
			s := newSched(t, Config{MaxQueue: 5, Clock: fixedClock{now}}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != "quiet" {
				t.Fatalf("picked %s, want quiet (the silent worker must not win on missing data)", l.Worker)
			}
			rec := l.Decision.Explain()
			ranks := map[string]int{}
			for _, c := range rec.Candidates {
				ranks[c.Worker] = c.Rank
				for _, tm := range c.Terms {
					if c.Worker == "silent" && tm.Name == term && !tm.Neutral {
						t.Errorf("silent worker's %s term not marked neutral: %+v", term, tm)
					}
				}
			}
			if got, want := ranks["silent"], 2; got != want {
				t.Fatalf("silent worker ranked %d, want %d (between quiet and busy): %v", got, want, ranks)
			}
		})
	}
}

// A reading that stopped being refreshed fades to neutral: a worker whose
// scrape broke while it looked idle must not keep winning on that reading.
func TestScheduler_StaleTelemetryLosesWeight(t *testing.T) {
	now := time.Now()
	kv := func(v float64, age time.Duration) *mutableSource {
		return newSource(snapshot.Snapshot{KVPressure: snapshot.Reading{Value: v, At: now.Add(-age), Source: "test"}})
	}
	tests := []struct {
		age  time.Duration
		want string
	}{
		{age: time.Second, want: "frozen"},     // fresh: its 0.0 wins
		{age: 20 * time.Second, want: "fresh"}, // past 3x stale_after: neutral (0.4) loses to 0.3
	}
	for _, tt := range tests {
		t.Run(tt.age.String(), func(t *testing.T) {
			ws := []WorkerSpec{
				{Name: "frozen", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0, tt.age)},
				{Name: "fresh", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0.3, 0)},
				{Name: "other", Models: []string{"m"}, MaxConcurrency: 4, Source: kv(0.5, 0)},
			}
			s := newSched(t, Config{MaxQueue: 5, StaleAfter: 3 * time.Second, Clock: fixedClock{now}}, ws...)
			l, err := s.Admit(context.Background(), Request{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != tt.want {
				t.Fatalf("picked %s, want %s", l.Worker, tt.want)
			}
		})
	}
}

// A record is built from what the pick kept, whenever it is read: read
// after the fleet has moved on, by several goroutines while the scheduler
// goes on picking (later records share the chunks of its slots that did
// not change), and after records made meanwhile were dropped, it says
// exactly what it says when read at once, and its Summary agrees with its
// candidates.
func TestScheduler_RecordReadLateSaysWhatItSaidAtOnce(t *testing.T) {
	run := func(t *testing.T, late bool) []string {
		clock := &fakeClock{t: time.Unix(1000, 0)}
		srcs := make([]*mutableSource, 6)
		ws := workers(len(srcs), 2, "m")
		for i := range srcs {
			srcs[i] = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPressure: snapshot.Reading{Value: 0.1 * float64(i), Source: "test", At: clock.t}})
			ws[i].Source = srcs[i]
		}
		ws[4].Models = []string{"other"}
		st, _ := stats.NewTracker(0.2, nil, nil)
		var mu sync.Mutex
		var recs []*decisions.Record
		var out []string
		marshal := func(r *decisions.Record) string {
			b, err := r.MarshalJSON()
			if err != nil {
				t.Error(err)
			}
			return string(b)
		}
		s := newSched(t, Config{MaxQueue: 1, Clock: clock, Stats: st, StaleAfter: time.Second, PrefixIndex: prefix.NewIndex(prefix.Options{}),
			Limits: limit.Config{MinSamples: 3}, Recorder: func(r *decisions.Record) {
				mu.Lock()
				defer mu.Unlock()
				recs = append(recs, r)
				if !late {
					out = append(out, marshal(r))
				}
			}}, ws...)
		// Late readers explain records while the scheduler picks.
		stop := make(chan struct{})
		var readers sync.WaitGroup
		for range 3 {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					// The newest record, unless it is one kept to the end:
					// those are first read there.
					mu.Lock()
					var r *decisions.Record
					if n := len(recs); n > 0 && (n-1)%3 != 0 {
						r = recs[n-1]
					}
					mu.Unlock()
					if late && r != nil {
						_ = r.Summary.Score
						marshal(r)
					}
				}
			}()
		}
		var pending []*Ticket
		var held []*Lease
		for i := range 40 {
			clock.t = clock.t.Add(300 * time.Millisecond)
			srcs[i%len(srcs)].Set(snapshot.Snapshot{Health: []snapshot.Health{snapshot.HealthOK, snapshot.HealthDown}[i%7/6], HealthReason: "probe failed",
				KVPressure: snapshot.Reading{Value: float64(i%5) / 5, Source: "test", At: clock.t}})
			pending = append(pending, s.Submit(Request{Model: "m", PromptTokens: 10 + i, Prefix: []uint64{uint64(i % 3), 7}}, nil))
			pending = slices.DeleteFunc(pending, func(tk *Ticket) bool {
				if !tk.Done() {
					return false
				}
				if l, err := tk.Result(); err == nil {
					held = append(held, l)
				}
				return true
			})
			if len(held) > 3 || (i%4 == 3 && len(held) > 0) {
				l := held[0]
				held = held[1:]
				st.Observe(l.Worker, stats.Observation{TTFT: time.Duration(100+i) * time.Millisecond, OutputTokens: 100, DecodeTPS: float64(40 + i%9)}, clock.t)
				l.Release()
			}
			if late {
				// Drop two records in three; the GC frees the chunks no
				// kept record shares.
				mu.Lock()
				for j := range recs {
					if j%3 != 0 {
						recs[j] = nil
					}
				}
				mu.Unlock()
				runtime.GC()
			}
		}
		close(stop)
		readers.Wait()
		for j, r := range recs {
			switch {
			case !late:
			case r == nil:
				out = append(out, "")
			default:
				out = append(out, marshal(r))
			}
			if r == nil {
				continue
			}
			sum := decisions.Summary{Candidates: len(r.Candidates)}
			for _, c := range r.Candidates {
				if c.Eligible {
					sum.Eligible++
				}
				if c.Worker == r.Chosen && r.Policy == string(PolicySluice) {
					sum.Score = c.Total
				}
			}
			if r.Summary != sum {
				t.Errorf("record %d: summary %+v, its candidates say %+v", j, r.Summary, sum)
			}
		}
		return out
	}
	atOnce, late := run(t, false), run(t, true)
	if len(atOnce) != 40 || len(late) != 40 {
		t.Fatalf("%d and %d records, want 40 each", len(atOnce), len(late))
	}
	for i := range atOnce {
		if late[i] != "" && atOnce[i] != late[i] {
			t.Fatalf("record %d read late:\n%s\nread at once:\n%s", i, late[i], atOnce[i])
		}
	}
}
