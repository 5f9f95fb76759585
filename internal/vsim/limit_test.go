package vsim

import (
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// cleanCard is a card with no collision noise whose per-stream decode
// rate falls steeply with the batch: 1000/(10+4k) tokens/s at k streams
// and speed 1 (71, 56, 45, 38, ...), so the knee under a floor is known.
func cleanCard(name string, speed float64) sim.WorkerSpec {
	p := sim.DefaultParams()
	p.Slots, p.InterferenceScale, p.Speed = 8, 0, speed
	p.DecodeBase, p.DecodePerSeq = 10*time.Millisecond, 4*time.Millisecond
	p.PrefillTokensPerSec = 1e6
	return sim.WorkerSpec{Name: name, Params: p}
}

// steady returns n requests at rate per second, of 10 prompt and 100
// output tokens.
func steady(n int, rate float64) []bench.Item {
	items := make([]bench.Item, n)
	for i := range items {
		items[i] = bench.Item{Row: i, At: time.Duration(float64(i) / rate * float64(time.Second)), PromptTokens: 10, OutputTokens: 100}
	}
	return items
}

// The controller finds each card's knee: the most streams at which the
// slowest still decode at the floor (40 tok/s): 3 at speed 1, 2 at 0.8,
// and 1 on a card that is under the floor even alone.
func TestController_ConvergesNearEachCardsKnee(t *testing.T) {
	fleet := []sim.WorkerSpec{cleanCard("fast", 1), cleanCard("mid", 0.8), cleanCard("slow", 0.5)}
	cfg := DefaultConfig(fleet)
	cfg.Concurrency.DecodeFirst = true // the floor alone sets the limits
	cfg.Concurrency.MinStreamTokS = 40
	cfg.Concurrency.BorrowAfter = time.Hour // judge the learned limits alone
	_, st, err := RunStats(cfg, steady(1500, 3))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"fast": 3, "mid": 2, "slow": 1}
	for _, w := range st.Workers {
		if w.Learned != want[w.Name] {
			t.Errorf("%s learned %d, want %d: %s", w.Name, w.Learned, want[w.Name], w.LimitReason)
		}
	}
}

// A card that slows to half speed mid-run is backed off to what it can
// still do, and climbs back once it recovers. The controller re-probes a
// level judged too slow once its verdict is a minute old, so the limit
// makes short excursions one level up; what it mostly is, is the knee.
func TestController_BacksOffWhenACardSlowsAndRecovers(t *testing.T) {
	card := cleanCard("gpu", 1)
	card.Params.Slowdowns = []sim.Slowdown{{After: 300 * time.Second, For: 300 * time.Second, Factor: 0.5}}
	cfg := DefaultConfig([]sim.WorkerSpec{card})
	cfg.Concurrency.DecodeFirst = true // the floor alone sets the limits
	cfg.Concurrency.MinStreamTokS = 40
	cfg.Concurrency.BorrowAfter = time.Hour
	type decision struct {
		at    time.Duration
		limit int
	}
	var mu sync.Mutex
	var ds []decision
	cfg.Recorder = func(r *decisions.Record) {
		mu.Lock()
		defer mu.Unlock()
		ds = append(ds, decision{r.Time.Sub(Epoch), r.Explain().Candidates[0].Limit})
	}
	if _, err := Run(cfg, steady(2400, 2)); err != nil {
		t.Fatal(err)
	}
	// mostly returns the limit most decisions in [from, to) were made at.
	mostly := func(from, to time.Duration) (int, map[int]int) {
		count := map[int]int{}
		for _, d := range ds {
			if d.at >= from && d.at < to {
				count[d.limit]++
			}
		}
		best := 0
		for l, n := range count {
			if n > count[best] || (n == count[best] && l < best) {
				best = l
			}
		}
		return best, count
	}
	for _, w := range []struct {
		name     string
		from, to time.Duration
		want     int
	}{
		{"before the slowdown", 100 * time.Second, 300 * time.Second, 3},
		{"late in the slowdown (alone it decodes 36 tok/s)", 420 * time.Second, 600 * time.Second, 1},
		{"after recovery", 800 * time.Second, 1200 * time.Second, 3},
	} {
		if got, count := mostly(w.from, w.to); got != w.want {
			t.Errorf("%s the limit was mostly %d, want %d (decisions per limit: %v)", w.name, got, w.want, count)
		}
	}
}

// Long prompts with short answers (code completion) at 70% of the demo
// fleet's capacity: each long prefill stalls the streams beside it, so a
// floor on decode rates alone holds every card at one or two streams and
// makes the median request wait for its first token far longer than
// least-connections does. The default (first tokens first) keeps the
// median within 1.1× of least-connections'; the floor-only controller is
// checked to reproduce the failure, so that this test can fail.
func TestRun_LongPromptsDoNotWaitBehindTheDecodeFloor(t *testing.T) {
	fleet := sim.DemoFleet()
	base, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: 2000, Seed: 1,
		Prompt: bench.CodePromptLengths, Output: bench.CodeOutputLengths})
	if err != nil {
		t.Fatal(err)
	}
	items, err := AtRate(base, 0.7*Capacity(fleet, base))
	if err != nil {
		t.Fatal(err)
	}
	p50 := func(cfg Config) float64 {
		t.Helper()
		sum := bench.Summarize(mustRun(t, cfg, items), bench.SLO{})
		if sum.Errors != 0 {
			t.Fatalf("%d errors", sum.Errors)
		}
		return sum.TTFT.P50
	}
	lcCfg := DefaultConfig(fleet)
	lcCfg.Policy = scheduler.PolicyLeastConnections
	lc := p50(lcCfg)
	def := p50(DefaultConfig(fleet))
	decodeFirst := DefaultConfig(fleet)
	decodeFirst.Concurrency.DecodeFirst = true
	df := p50(decodeFirst)
	t.Logf("TTFT p50: default %.0f ms, decode_first %.0f ms, least-connections %.0f ms", def, df, lc)
	if def > 1.1*lc {
		t.Errorf("default TTFT p50 %.0f ms, least-connections %.0f: want at most 1.1×", def, lc)
	}
	if df <= 1.1*lc {
		t.Errorf("decode_first TTFT p50 %.0f ms, least-connections %.0f: the failure this test guards against no longer reproduces", df, lc)
	}
}
