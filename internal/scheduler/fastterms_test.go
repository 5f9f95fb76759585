package scheduler

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// genericTotals is totals without the built-in path.
func genericTotals(terms []WeightedTerm, env *Env, cands []Candidate) []float64 {
	var sc scratch
	sc.grow(len(cands))
	return termTotals(terms, env, cands, &sc)
}

// customTerm is a term builtinTotals does not know.
type customTerm struct{ activeRequests }

// builtinTotals gives the totals the terms' own Score methods give, bit
// for bit, whatever the telemetry and history (missing, stale, odd) and
// the weights; it leaves other lists of terms to them.
func TestBuiltinTotals(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(1000, 0)
	pick := func(vs ...float64) float64 { return vs[rng.IntN(len(vs))] }
	reading := func() Reading {
		switch rng.IntN(4) {
		case 0:
			return Reading{} // never read
		case 1:
			return Reading{Value: pick(-1, 0, 0.3, 1, 1.7, 12), Source: "s", At: now.Add(-time.Duration(rng.IntN(8000)) * time.Millisecond)}
		}
		return Reading{Value: rng.Float64() * pick(1, 5), Source: "s", At: now}
	}
	ema := func() stats.EMA {
		if rng.IntN(5) == 0 {
			return stats.EMA{}
		}
		return stats.EMA{Value: pick(0, -2, 1) * rng.Float64() * 200, N: 1 + rng.Int64N(9)}
	}
	weights := []Weights{DefaultWeights(), {ActiveRequests: 1, QueueLength: 0.3, Latency: 7, JobCost: 0, Throughput: 11, KVPressure: 2.5, GPUUtil: 1e-3, Prefix: 3}}
	for iter := range 400 {
		n := 1 + rng.IntN(12)
		cands := make([]Candidate, n)
		for i := range cands {
			snap := &Snapshot{QueueLen: reading(), KVPressure: reading(), GPUUtil: reading()}
			st := &stats.WorkerStats{TTFTMs: ema(), DecodeTPS: ema()}
			cands[i] = Candidate{Name: "w", Active: rng.IntN(4), JobCost: pick(0, 0, 100, 2500) * rng.Float64(), Snap: snap, Stats: st, PrefixMatch: pick(0, 0.5, 1, 1.2)}
		}
		terms := DefaultTerms(weights[iter%len(weights)])
		env := &Env{Now: now, StaleAfter: []time.Duration{0, 2 * time.Second}[iter%2]}
		want := genericTotals(terms, env, cands)
		var sc scratch
		sc.grow(n)
		if !builtinTotals(terms, env, cands, &sc) {
			t.Fatalf("iteration %d: built-in terms not taken as built in", iter)
		}
		for i := range want {
			if math.Float64bits(sc.total[i]) != math.Float64bits(want[i]) {
				t.Fatalf("iteration %d, candidate %d: total %v, the terms give %v", iter, i, sc.total[i], want[i])
			}
		}
	}
	others := map[string][]WeightedTerm{
		"custom":    {{customTerm{}, 1}},
		"fewer":     DefaultTerms(DefaultWeights())[:7],
		"reordered": append(DefaultTerms(DefaultWeights())[1:], DefaultTerms(DefaultWeights())[0]),
		"replaced":  append(DefaultTerms(DefaultWeights())[:7], WeightedTerm{customTerm{}, 1}),
	}
	for name, terms := range others {
		var sc scratch
		sc.grow(1)
		if builtinTotals(terms, &Env{}, []Candidate{{Snap: &Snapshot{}, Stats: &stats.WorkerStats{}}}, &sc) {
			t.Errorf("%s terms taken as the built-in score", name)
		}
	}
}
