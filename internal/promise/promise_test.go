package promise

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/predict"
)

func TestFloorChance(t *testing.T) {
	for _, tt := range []struct {
		name            string
		rate, cv, floor float64
		want, within    float64
	}{
		{"no floor", 3, 0.5, 0, 1, 0},
		{"nothing runs", 0, 0.5, 15, 1, 0},
		{"no spread known, above", 20, 0, 15, 1, 0},
		{"no spread known, below", 10, 0, 15, 0, 0},
		{"at the floor: a coin", 15, 0.4, 15, 0.5, 1e-12},
		// σ = √ln(1 + 0.3²) = 0.2936; ln 2 / σ = 2.361: Φ = 0.9909.
		{"twice the floor, cv 0.3", 30, 0.3, 15, 0.9909, 1e-4},
		{"half the floor, cv 0.3", 7.5, 0.3, 15, 1 - 0.9909, 1e-4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := FloorChance(tt.rate, tt.cv, tt.floor); math.Abs(got-tt.want) > tt.within {
				t.Errorf("FloorChance(%v, %v, %v) = %.5f, want %.5f", tt.rate, tt.cv, tt.floor, got, tt.want)
			}
		})
	}
}

// Judge's verdicts on hand-made predictions: which workers keep the
// request, and what it decided.
func TestJudge(t *testing.T) {
	sec := time.Second
	fast := predict.Prediction{Known: true, TTFT: sec, Decode: 40}
	slow := predict.Prediction{Known: true, TTFT: 9 * sec, Decode: 40, FreeIn: 20 * sec, TTFTAfterOne: sec, DecodeAfterOne: 40}
	soon := predict.Prediction{Known: true, TTFT: 9 * sec, Decode: 40, FreeIn: sec, TTFTAfterOne: sec, DecodeAfterOne: 40}
	serve := predict.SLO{TTFT: 5 * sec, MinDecode: 10, OnMiss: predict.OnMissServe}
	refuse := predict.SLO{TTFT: 5 * sec, MinDecode: 10, OnMiss: predict.OnMissRefuse}
	for _, tt := range []struct {
		name  string
		slo   predict.SLO
		ws    []Worker
		want  Verdict
		keeps []bool
	}{
		{"one meets", serve, []Worker{{Pred: slow, Judged: true}, {Pred: fast, Judged: true}}, Meets, []bool{false, true}},
		{"none judged: one under its limit", serve, []Worker{{UnderLimit: true}, {}}, Meets, []bool{true, false}},
		{"none judged, all full: wait as ever", serve, []Worker{{}, {}}, Limits, []bool{false, false}},
		{"waiting is sooner", serve, []Worker{{Pred: soon, Judged: true}}, Wait, []bool{false}},
		{"nobody, on_miss serve", serve, []Worker{{Pred: slow, Judged: true}}, Serve, []bool{true}},
		{"nobody, on_miss refuse", refuse, []Worker{{Pred: slow, Judged: true}}, Refuse, []bool{false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			jm := Judge(tt.ws, tt.slo, tt.slo.TTFT, tt.slo.TTFT)
			var keeps []bool
			for _, w := range tt.ws {
				keeps = append(keeps, w.Keeps)
			}
			if jm.Verdict != tt.want || !slices.Equal(keeps, tt.keeps) {
				t.Errorf("verdict %d, keeps %v; want %d, %v", jm.Verdict, keeps, tt.want, tt.keeps)
			}
		})
	}
}
