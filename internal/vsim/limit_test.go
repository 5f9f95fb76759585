package vsim

import (
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// Long prompts with short answers (code completion) at 70% of the demo
// fleet's capacity: each long prefill stalls the streams beside it, so a
// floor on decode rates alone would hold every card at one or two streams
// and make the median request wait for its first token far longer than
// least-connections does. The learned limits keep the median within 1.1×
// of least-connections'.
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
	t.Logf("TTFT p50: default %.0f ms, least-connections %.0f ms", def, lc)
	if def > 1.1*lc {
		t.Errorf("default TTFT p50 %.0f ms, least-connections %.0f: want at most 1.1×", def, lc)
	}
}
