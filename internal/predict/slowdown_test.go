package predict

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/sim"
)

// TestPredictor_FollowsASlowdownWithinTenOutcomes slows a card to half
// its speed mid-run (sim's Slowdowns: a throttle, a noisy neighbour) and
// checks that predictions made after ten outcomes of the slower card are
// about as good as on a card that was always that slow, while those made just after it began were off by
// about the slowdown (so the test sees the change it claims to follow).
func TestPredictor_FollowsASlowdownWithinTenOutcomes(t *testing.T) {
	p := card(1, 4, 2048, 3)
	p.InterferenceScale = 0
	const after = 1500 * time.Second
	p.Slowdowns = []sim.Slowdown{{After: after, Factor: 0.5}}
	l := newLearner(t)
	start := time.Unix(1_800_000_000, 0) // drive's start
	slowFrom := start.Add(after)

	// For each request sent after the slowdown began, by send order, how
	// many outcomes of requests sent after it had been observed then
	// (-1: sent before it).
	var observedAtSend []int
	var observedSlow int
	slow := map[int]bool{}
	var early, late relErrs
	drive(t, p, trafficSpec{rate: 0.15, promptMedian: 800, promptSigma: 0.6, n: 500, seed: 11},
		func(in Input, at time.Time) Prediction {
			n := -1
			if at.After(slowFrom) {
				n = observedSlow
				slow[len(observedAtSend)] = true
			}
			observedAtSend = append(observedAtSend, n)
			return l.p.Predict("w", in)
		},
		func(pred Prediction, o Outcome, idx int) {
			switch n := observedAtSend[idx]; {
			case n < 0:
			case n < 2:
				early.add(pred, o)
			case n >= 10 && n < 40:
				late.add(pred, o)
			}
			if slow[idx] {
				observedSlow++
			}
			l.finish("w", pred, o)
		})
	t.Logf("early (before 2 slow outcomes): TTFT %.3f decode %.3f (%d); after 10: TTFT %.3f decode %.3f (%d)",
		median(early.ttft), median(early.decode), len(early.ttft), median(late.ttft), median(late.decode), len(late.ttft))
	// The same traffic on a card that was always that slow, for what
	// the predictor achieves on it in steady state.
	q := card(0.5, 4, 2048, 3)
	q.InterferenceScale = 0
	lq := newLearner(t)
	var steady relErrs
	drive(t, q, trafficSpec{rate: 0.15, promptMedian: 800, promptSigma: 0.6, n: 500, seed: 11},
		func(in Input, _ time.Time) Prediction { return lq.p.Predict("w", in) },
		func(pred Prediction, o Outcome, idx int) {
			if idx >= 250 {
				steady.add(pred, o)
			}
			lq.finish("w", pred, o)
		})
	t.Logf("always slow, steady state: TTFT %.3f decode %.3f", median(steady.ttft), median(steady.decode))
	if len(early.ttft) == 0 || median(early.ttft) < 0.3 {
		t.Fatalf("predictions just after the slowdown were off by %.3f; the slowdown did not show", median(early.ttft))
	}
	if len(late.ttft) < 15 {
		t.Fatalf("only %d predictions after ten slow outcomes", len(late.ttft))
	}
	if got, want := median(late.ttft), max(0.1, median(steady.ttft)+0.05); got > want {
		t.Errorf("median TTFT error after ten slow outcomes %.3f, want ≤ %.3f (steady state + 5 points)", got, want)
	}
	if got := median(late.decode); got > 0.15 {
		t.Errorf("median decode error after ten slow outcomes %.3f, want ≤ 0.15", got)
	}
}
