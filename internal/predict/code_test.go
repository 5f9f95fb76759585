package predict

import (
	"testing"
	"time"
)

// TestPredictor_CodeCompletionTraffic runs code-completion traffic —
// long prompts (median 1,500 tokens), short answers (median 13) — on a
// clean reference card at three loads and holds the TTFT predictions to
// 20 %. The decode rate of such short streams is bimodal (a prompt that
// arrives while one runs stalls it by its whole prefill, one that does
// not leaves it at the solo rate), and which happens is decided after the
// prediction, by later arrivals, so its error is logged, not bounded.
func TestPredictor_CodeCompletionTraffic(t *testing.T) {
	for _, rate := range []float64{0.5, 1, 1.5} {
		p := card(1, 4, 2048, 2)
		p.OutputMedian, p.OutputSigma, p.OutputMin = 13, 1.2, 1
		p.InterferenceScale = 0
		l := newLearner(t)
		var errs relErrs
		drive(t, p, trafficSpec{rate: rate, promptMedian: 1500, promptSigma: 0.7, n: 800, seed: 5},
			func(in Input, _ time.Time) Prediction { return l.p.Predict("w", in) },
			func(pred Prediction, o Outcome, idx int) {
				if idx >= 300 {
					errs.add(pred, o)
				}
				l.finish("w", pred, o)
			})
		tt, dec := median(errs.ttft), median(errs.decode)
		t.Logf("%.1f requests/s: median relative error TTFT %.3f, decode %.3f", rate, tt, dec)
		if tt > 0.2 {
			t.Errorf("%.1f requests/s: median TTFT error %.3f, want ≤ 0.20", rate, tt)
		}
	}
}
