package predict

import (
	"math"
	"testing"
	"time"
)

func TestTally_QuantilesReadWithinTheirBins(t *testing.T) {
	var tl Tally
	if got := tl.Median(); got != 0 {
		t.Fatalf("empty tally's median = %v, want 0", got)
	}
	// 0.5 % … 99.5 %: one error in the middle of each 1 % bin.
	for i := range 100 {
		tl.Add((float64(i) + 0.5) / 100)
	}
	tl.Add(math.NaN()) // not an error: ignored
	tl.Add(-1)
	if tl.N() != 100 {
		t.Fatalf("N = %d, want 100", tl.N())
	}
	for _, tc := range []struct{ q, want float64 }{
		{0.5, 0.495}, {0.9, 0.895}, {0.01, 0.005}, {1, 0.995},
	} {
		if got := tl.Quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestTally_LargeErrorsShareTheLastBin(t *testing.T) {
	var tl Tally
	tl.Add(0.1)
	tl.Add(7)
	tl.Add(12)
	if got := tl.Quantile(1); got != 3 {
		t.Errorf("max = %v, want 3 (the last bin)", got)
	}
	if got := tl.Median(); got != 3 {
		t.Errorf("median = %v, want 3", got)
	}
}

func TestTally_MergeAddsCounts(t *testing.T) {
	var a, b Tally
	for range 3 {
		a.Add(0.05)
	}
	b.Add(0.5)
	b.Add(0.6)
	b.Add(0.7)
	b.Add(0.8)
	a.Merge(&b)
	if a.N() != 7 {
		t.Fatalf("N = %d, want 7", a.N())
	}
	// Ranks 1–3 at 5 %, 4–7 at 50–80 %: the 4th of 7 is 50 %.
	if got := a.Median(); got != 0.505 {
		t.Errorf("median = %v, want in the 50 %% bin", got)
	}
}

func TestPredictor_RunErrorsCountEveryRecord(t *testing.T) {
	p := newLearner(t).p
	pred := Prediction{Known: true, TTFT: 100 * time.Millisecond, Decode: 50}
	for range 40 { // more than the trust window holds
		p.Record("w", pred, Outcome{TTFT: 125 * time.Millisecond, DecodeTPS: 40})
	}
	ttft, dec := p.RunErrors("w")
	if ttft.N() != 40 || dec.N() != 40 {
		t.Fatalf("tallied %d and %d, want 40 each", ttft.N(), dec.N())
	}
	// |100 − 125| / 125 = 20 %; |50 − 40| / 40 = 25 %: each in its bin.
	if got := ttft.Median(); got < 0.20 || got >= 0.21 {
		t.Errorf("TTFT median = %v, want in [0.20, 0.21)", got)
	}
	if got := dec.Median(); got < 0.25 || got >= 0.26 {
		t.Errorf("decode median = %v, want in [0.25, 0.26)", got)
	}
	p.Record("w", Prediction{Known: false, TTFT: time.Millisecond, Decode: 1}, Outcome{TTFT: 125 * time.Millisecond, DecodeTPS: 40})
	if ttft, _ := p.RunErrors("w"); ttft.N() != 40 {
		t.Errorf("an unknown prediction was tallied")
	}
}
