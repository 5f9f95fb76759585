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

// customTerm is a term fastTotals does not know: it is run through its
// own Score.
type customTerm struct{ activeRequests }

func (customTerm) Name() string { return "custom" }
func (customTerm) Score(_ *Env, c []Candidate, raw, norm []float64) {
	for i := range c {
		raw[i] = c[i].JobCost
		norm[i] = math.Sqrt(c[i].JobCost) / 7
	}
}

// fastTotals gives the totals the terms' own Score methods give, bit for
// bit, whatever the telemetry and history (missing, stale, odd), the
// weights and the list of terms: the shipped one, reordered, shortened,
// with a term it does not know.
func TestFastTotals(t *testing.T) {
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
	lists := map[string]func(Weights) []WeightedTerm{
		"shipped": DefaultTerms,
		"fewer":   func(w Weights) []WeightedTerm { return DefaultTerms(w)[:5] },
		"reordered": func(w Weights) []WeightedTerm {
			d := DefaultTerms(w)
			return append(d[3:], d[:3]...)
		},
		"custom": func(w Weights) []WeightedTerm {
			d := DefaultTerms(w)
			return append(d[:4], append([]WeightedTerm{{customTerm{}, 2}}, d[4:]...)...)
		},
		"only custom": func(Weights) []WeightedTerm { return []WeightedTerm{{customTerm{}, 1}} },
	}
	for name, list := range lists {
		var sc scratch // reused across iterations, as a scheduler's is
		var prev []Candidate
		for iter := range 300 {
			n := 1 + rng.IntN(12)
			cands := make([]Candidate, n)
			for i := range cands {
				snap := &Snapshot{QueueLen: reading(), KVPressure: reading(), GPUUtil: reading()}
				st := &stats.WorkerStats{TTFTMs: ema(), DecodeTPS: ema()}
				if i < len(prev) && rng.IntN(3) > 0 {
					// The same telemetry or stats as the last pick's at this
					// place, or another place: what the scratch kept of it
					// must hold, or be read again.
					from := prev[rng.IntN(len(prev))].Snap
					if rng.IntN(2) == 0 {
						from = prev[i].Snap
					}
					snap, st = from, prev[rng.IntN(len(prev))].Stats
				}
				cands[i] = Candidate{Name: "w", Active: rng.IntN(4), JobCost: pick(0, 0, 100, 2500) * rng.Float64(), Snap: snap, Stats: st, PrefixMatch: pick(0, 0.5, 1, 1.2)}
			}
			prev = cands
			terms := list(weights[iter%len(weights)])
			// The time moves, so a reading kept fresh at one pick may be
			// stale at the next.
			at := now.Add(time.Duration(rng.IntN(6000)) * time.Millisecond)
			env := &Env{Now: at, StaleAfter: []time.Duration{0, 2 * time.Second, time.Second}[rng.IntN(3)], Req: &Request{PromptTokens: rng.IntN(3000)}}
			want := genericTotals(terms, env, cands)
			got := totals(terms, env, cands, &sc)
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("%s, iteration %d, candidate %d: total %v, the terms give %v", name, iter, i, got[i], want[i])
				}
			}
		}
	}
}
