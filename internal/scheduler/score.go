package scheduler

// The score: the terms' values times their weights, summed, in one
// place (totals), and the same recomputed term by term for a record
// (explain).

import (
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// scratch is reusable space for scoring, owned by the scheduler's lock.
type scratch struct {
	raw, norm, total []float64
	order            []int
	// slots and refs are the slots of the pick in progress (keepLocked);
	// slotChunks and refChunks are the latest record's, which the next
	// record shares where nothing changed.
	slots      []slot
	refs       []slotRefs
	slotChunks []*slotChunk
	refChunks  []*refChunk
	// names, frac and remote are guessesLocked's space.
	names  []string
	frac   []float64
	remote []bool
}

func (sc *scratch) grow(n int) {
	if cap(sc.raw) < n {
		sc.raw, sc.norm, sc.total, sc.order = make([]float64, n), make([]float64, n), make([]float64, n), make([]int, n)
	}
	sc.raw, sc.norm, sc.total, sc.order = sc.raw[:n], sc.norm[:n], sc.total[:n], sc.order[:n]
}

// totals runs every term over cands and returns each candidate's weighted
// sum. It is the one place weights are applied; it builds no records.
// The result lives in sc.
func totals(terms []WeightedTerm, env *Env, cands []Candidate, sc *scratch) []float64 {
	sc.grow(len(cands))
	out := sc.total
	clear(out)
	for _, wt := range terms {
		wt.Term.Score(env, cands, sc.raw, sc.norm)
		w := signedWeight(wt)
		for i, n := range sc.norm {
			out[i] += w * n
		}
	}
	return out
}

// explain recomputes the terms from the same candidates (terms are pure,
// so the numbers are identical to those totals summed) and returns each
// candidate's breakdown for the decision record.
func explain(terms []WeightedTerm, env *Env, cands []Candidate) [][]decisions.Term {
	recs := make([][]decisions.Term, len(cands))
	slab := make([]decisions.Term, len(cands)*len(terms))
	for i := range recs {
		recs[i] = slab[i*len(terms) : i*len(terms) : (i+1)*len(terms)]
	}
	var sc scratch
	sc.grow(len(cands))
	for _, wt := range terms {
		wt.Term.Score(env, cands, sc.raw, sc.norm)
		w := signedWeight(wt)
		for i := range cands {
			src, at, neutral := wt.Term.Provenance(env, &cands[i])
			t := decisions.Term{Name: wt.Term.Name(), Raw: sc.raw[i], Norm: sc.norm[i], Weight: w, Weighted: noNegZero(w * sc.norm[i]), Source: src, Neutral: neutral}
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

// noNegZero is f with -0 (a reward's weight times a zero value) made 0,
// so a record reads "weighted":0 rather than -0; the totals are sums
// from +0 and never hold -0.
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
