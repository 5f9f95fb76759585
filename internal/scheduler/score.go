package scheduler

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// totals runs every term over cands and returns each candidate's weighted
// sum. It is the one place weights are applied; it builds no records.
func totals(terms []WeightedTerm, env *Env, cands []Candidate) []float64 {
	n := len(cands)
	out := make([]float64, n) // kept by the record
	// raw and norm are scratch, which a term only writes and reads during
	// its Score: they come from scorePool and go back.
	sp := scorePool.Get().(*[]float64)
	scratch := slices.Grow((*sp)[:0], 2*n)[:2*n]
	raw, norm := scratch[:n:n], scratch[n:]
	for _, wt := range terms {
		wt.Term.Score(env, cands, raw, norm)
		w := signedWeight(wt)
		for i, n := range norm {
			out[i] += w * n
		}
	}
	*sp = scratch[:0]
	scorePool.Put(sp)
	return out
}

var scorePool = sync.Pool{New: func() any { return new([]float64) }}

// explain recomputes the terms from the same candidates (terms are pure)
// and returns each candidate's breakdown for the decision record.
func explain(terms []WeightedTerm, env *Env, cands []Candidate) [][]decisions.Term {
	recs := make([][]decisions.Term, len(cands))
	slab := make([]decisions.Term, len(cands)*len(terms))
	for i := range recs {
		recs[i] = slab[i*len(terms) : i*len(terms) : (i+1)*len(terms)]
	}
	raw, norm := make([]float64, len(cands)), make([]float64, len(cands))
	for _, wt := range terms {
		wt.Term.Score(env, cands, raw, norm)
		w := signedWeight(wt)
		for i := range cands {
			src, at, neutral := wt.Term.Provenance(env, &cands[i])
			t := decisions.Term{Name: wt.Term.Name(), Raw: raw[i], Norm: norm[i], Weight: w, Weighted: noNegZero(w * norm[i]), Source: src, Neutral: neutral}
			if !at.IsZero() {
				age := env.Now.Sub(at)
				t.AgeMs = float64(age) / float64(time.Millisecond)
				t.Stale = env.StaleAfter > 0 && age > env.StaleAfter && isTelemetry(wt.Term)
			}
			recs[i] = append(recs[i], t)
		}
	}
	return recs
}

// noNegZero makes -0 (a reward's weight times 0) read 0 in records.
func noNegZero(f float64) float64 {
	if f == 0 {
		return 0
	}
	return f
}

// signedWeight is the weight as applied: negative for a reward.
func signedWeight(wt WeightedTerm) float64 {
	if wt.Term.Reward() {
		return -wt.Weight
	}
	return wt.Weight
}
