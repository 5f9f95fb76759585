package predict

import (
	"testing"
	"time"
)

// TestPredictor_ConvergesOnEachCard drives four simulated cards of mixed
// speed, slots and batch budget, each with open-loop Poisson traffic at
// about 70 % of what it sustains (rates found by sweeping each card), and
// checks the median relative error of the predictions made at send time
// for the requests after the first 200. All cards share one Predictor, as
// a fleet does.
//
// With the sim's collision noise off the card is deterministic given the
// traffic, and the goals hold: TTFT ≤ 20 %, decode ≤ 10 %. Two kinds of
// error no predictor can remove are measured separately, with the bounds
// they were measured at: the sim's interference (a log-normal, σ = 1,
// factor drawn at every batch change: "an amount nobody can predict", see
// package sim), and, on the chunked card with 60-token answers, the stall
// of prompts that arrive after a request was sent (a short stream either
// meets one or not, so its rate is bimodal).
func TestPredictor_ConvergesOnEachCard(t *testing.T) {
	cards := []struct {
		name         string
		speed        float64
		slots, batch int
		rate         float64 // requests/s, about 70 % load
		prompt       float64 // median prompt tokens
		output       float64 // median output tokens
		interference bool
		maxTTFT      float64
		maxDecode    float64
	}{
		{"slow-a10", 0.6, 4, 2048, 0.15, 800, 180, false, 0.20, 0.10},
		{"a100", 1, 4, 2048, 0.3, 800, 180, false, 0.20, 0.10},
		{"h100-8slot", 2, 8, 2048, 0.8, 800, 180, false, 0.20, 0.10},
		{"h100-chunked", 2, 4, 512, 1.2, 1500, 60, false, 0.20, 0.25}, // late arrivals' stalls
		// The interference factor alone, 1 + 0.1·(k−1)·L, leaves the best
		// constant predictor a median relative error of 4 % at k = 2, 8 %
		// at 3, 12 % at 4, 15 % at 5 and 18 % at 6 (computed from the
		// log-normal); these bounds sit above what was measured.
		{"slow-a10-noisy", 0.6, 4, 2048, 0.15, 800, 180, true, 0.20, 0.20},
		{"a100-noisy", 1, 4, 2048, 0.3, 800, 180, true, 0.20, 0.20},
		{"h100-8slot-noisy", 2, 8, 2048, 0.8, 800, 180, true, 0.25, 0.25},
	}
	l := newLearner(t)
	for i, c := range cards {
		t.Run(c.name, func(t *testing.T) {
			p := card(c.speed, c.slots, c.batch, int64(i+1))
			p.OutputMedian = c.output
			if !c.interference {
				p.InterferenceScale = 0
			}
			const n, warm = 600, 200
			var errs relErrs
			drive(t, p, trafficSpec{rate: c.rate, promptMedian: c.prompt, promptSigma: 0.6, n: n, seed: uint64(i + 7)},
				func(in Input, _ time.Time) Prediction { return l.p.Predict(c.name, in) },
				func(pred Prediction, o Outcome, idx int) {
					if idx >= warm {
						errs.add(pred, o)
					}
					l.finish(c.name, pred, o)
				})
			if got, want := len(errs.ttft), (n-warm)*9/10; got < want {
				t.Fatalf("%d known TTFT predictions after warm-up, want at least %d", got, want)
			}
			tt, dec := median(errs.ttft), median(errs.decode)
			t.Logf("median relative error: TTFT %.3f, decode %.3f (%d, %d predictions)", tt, dec, len(errs.ttft), len(errs.decode))
			if tt > c.maxTTFT {
				t.Errorf("median TTFT error %.3f, want ≤ %.2f", tt, c.maxTTFT)
			}
			if dec > c.maxDecode {
				t.Errorf("median decode error %.3f, want ≤ %.2f", dec, c.maxDecode)
			}
		})
	}
}
