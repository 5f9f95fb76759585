package vsim

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRun_SlowdownHalvesTheCardsTokenRateInItsWindow sends one request
// at a time to a single card that runs at half speed from 20 s to 40 s
// of virtual time: requests sent inside the window decode at half the
// rate of those before and after it, which recover the card's full rate.
func TestRun_SlowdownHalvesTheCardsTokenRateInItsWindow(t *testing.T) {
	fleet := fleetOf(1, func(p *sim.Params) {
		p.InterferenceScale = 0
		p.Slowdowns = []sim.Slowdown{{After: 20 * time.Second, For: 20 * time.Second, Factor: 0.5}}
	})
	var items []bench.Item
	for i := range 15 {
		// 100 tokens take under 3 s alone at half speed: one request at a time.
		items = append(items, bench.Item{At: time.Duration(4*i) * time.Second, PromptTokens: 200, OutputTokens: 100, Row: i + 1})
	}
	res := mustRun(t, DefaultConfig(fleet), items)
	rate := func(from, to time.Duration) float64 {
		sum, n := 0.0, 0
		for _, r := range res {
			if r.Start >= from && r.Start+r.E2E <= to {
				sum += r.DecodeRate
				n++
			}
		}
		if n == 0 {
			t.Fatalf("no request ran wholly in [%v, %v)", from, to)
		}
		return sum / float64(n)
	}
	before, during, after := rate(0, 20*time.Second), rate(20*time.Second, 40*time.Second), rate(40*time.Second, time.Minute)
	t.Logf("decode rate before %.1f, during %.1f, after %.1f tok/s", before, during, after)
	if r := during / before; r < 0.48 || r > 0.52 {
		t.Errorf("decode rate during the slowdown is %.3f× the rate before, want 0.5×", r)
	}
	if r := after / before; r < 0.98 || r > 1.02 {
		t.Errorf("decode rate after the slowdown is %.3f× the rate before, want 1× (recovered)", r)
	}
}
