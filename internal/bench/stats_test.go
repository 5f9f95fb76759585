package bench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile_NearestRank(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		data []float64
		p    float64
		want float64
	}{
		{ten, 0, 1},
		{ten, 10, 1},  // ceil(1.0) = rank 1
		{ten, 11, 2},  // ceil(1.1) = rank 2
		{ten, 50, 5},  // ceil(5) = rank 5, not the interpolated 5.5
		{ten, 90, 9},  // 0.9*10 must not round up to rank 10
		{ten, 99, 10}, // ceil(9.9) = rank 10
		{ten, 100, 10},
		{[]float64{15, 20, 35, 40, 50}, 30, 20}, // Wikipedia's example: ceil(1.5) = 2
		{[]float64{15, 20, 35, 40, 50}, 40, 20}, // ceil(2.0) = 2
		{[]float64{15, 20, 35, 40, 50}, 50, 35},
		{[]float64{7}, 99, 7},
	}
	for _, tc := range tests {
		if got := Percentile(tc.data, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.data, tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("empty: got %v, want NaN", got)
	}
	// p99 of 1000 values 1..1000 is 990.
	var k []float64
	for i := 1; i <= 1000; i++ {
		k = append(k, float64(i))
	}
	if got := Percentile(k, 99); got != 990 {
		t.Errorf("p99 of 1..1000 = %v, want 990", got)
	}
}

func ok(start, ttft, e2e time.Duration, tokens int) Result {
	r := Result{Start: start, TTFT: ttft, E2E: e2e, OutputTokens: tokens, Status: 200, QueueMs: -1}
	if tokens >= 2 {
		r.TPOT = (e2e - ttft) / time.Duration(tokens-1)
		r.DecodeRate = float64(tokens-1) / (e2e - ttft).Seconds()
	}
	return r
}

func TestSummarize_Maths(t *testing.T) {
	ms := time.Millisecond
	results := []Result{
		ok(0, 100*ms, 1100*ms, 11),       // TPOT 100ms, 10 tok/s
		ok(500*ms, 200*ms, 700*ms, 11),   // TPOT 50ms, 20 tok/s
		ok(1000*ms, 900*ms, 1400*ms, 11), // TPOT 50ms, 20 tok/s, TTFT over SLO
		ok(1500*ms, 100*ms, 100*ms, 1),   // one token: no TPOT, passes the TPOT bound
		{Start: 1600 * ms, E2E: 10 * ms, Status: 429, Kind: KindRefused, Reason: "queue_full", QueueMs: -1},
		{Start: 1700 * ms, E2E: 300 * ms, Status: 500, Kind: KindHTTP, QueueMs: -1},
	}
	s := Summarize(results, SLO{TTFT: 500 * ms, TPOT: 60 * ms})
	if s.Count != 6 || s.OK != 4 || s.Errors != 2 {
		t.Fatalf("counts %d/%d/%d", s.Count, s.OK, s.Errors)
	}
	if s.ErrorsByKind["refused 429"] != 1 || s.ErrorsByKind["http 500"] != 1 || s.Refusals["queue_full"] != 1 {
		t.Fatalf("error kinds %v, refusals %v", s.ErrorsByKind, s.Refusals)
	}
	// Span: first start 0 to last end 1000+1400 ms.
	if s.Span != 2400*ms {
		t.Fatalf("span %v, want 2.4s", s.Span)
	}
	if got, want := s.RequestsPerSec, 4/2.4; math.Abs(got-want) > 1e-9 {
		t.Errorf("req/s %v, want %v", got, want)
	}
	if got, want := s.OutputTokensPerSec, 34/2.4; math.Abs(got-want) > 1e-9 {
		t.Errorf("tok/s %v, want %v", got, want)
	}
	// Meeting the SLO: requests 2 and 4 (1 fails TPOT, 3 fails TTFT).
	if got, want := s.Goodput, 2/2.4; math.Abs(got-want) > 1e-9 {
		t.Errorf("goodput %v, want %v", got, want)
	}
	if got, want := s.Attainment, 2.0/6; got != want {
		t.Errorf("attainment %v, want %v", got, want)
	}
	// TTFT over the 4 successes: 100, 100, 200, 900.
	if s.TTFT.N != 4 || s.TTFT.P50 != 100 || s.TTFT.P90 != 900 || s.TTFT.Max != 900 || s.TTFT.TailRatio != 9 || s.TTFT.Mean != 325 {
		t.Errorf("TTFT %+v", s.TTFT)
	}
	// Decode rates 10, 20, 20: mean 50/3, population sd sqrt(200/9).
	d := s.DecodeRate
	if d.N != 3 || math.Abs(d.Mean-50.0/3) > 1e-9 || d.P1 != 10 || d.P5 != 10 || d.P50 != 20 {
		t.Errorf("decode %+v", d)
	}
	if want := math.Sqrt(200.0/9) / (50.0 / 3); math.Abs(d.CV-want) > 1e-9 {
		t.Errorf("decode CV %v, want %v", d.CV, want)
	}
	if s.TPOT.N != 3 || s.TPOT.P50 != 50 || s.TPOT.Max != 100 {
		t.Errorf("TPOT %+v", s.TPOT)
	}
}

func TestSummarize_Empty(t *testing.T) {
	s := Summarize(nil, SLO{})
	if s.Count != 0 || s.Goodput != 0 || s.TTFT.N != 0 {
		t.Fatalf("%+v", s)
	}
}

func TestSLO_Met(t *testing.T) {
	r := ok(0, 100*time.Millisecond, 1100*time.Millisecond, 11)
	if !(SLO{}).Met(r) {
		t.Error("zero SLO must accept a success")
	}
	r.Kind = KindTimeout
	if (SLO{}).Met(r) {
		t.Error("a failure met the SLO")
	}
}

// The default SLO allows for the prompt in its TTFT bound and holds each
// stream to a decode floor.
func TestSLO_DefaultAllowsForThePromptAndHoldsTheDecodeFloor(t *testing.T) {
	tests := []struct {
		name   string
		prompt int
		ttft   time.Duration
		rate   float64
		tokens int
		want   bool
	}{
		{"quick first token, fast stream", 100, time.Second, 30, 50, true},
		{"2.5 s for 2,000 prompt tokens: within 2 s + 2×250 ms", 2000, 2500 * time.Millisecond, 30, 50, true},
		{"2.6 s for 2,000 prompt tokens: late", 2000, 2600 * time.Millisecond, 30, 50, false},
		{"2.1 s for a short prompt: late", 100, 2100 * time.Millisecond, 30, 50, false},
		{"decode under 15 tok/s", 100, time.Second, 14, 50, false},
		{"one token: no decode rate to hold", 100, time.Second, 0, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Result{PromptTokens: tt.prompt, TTFT: tt.ttft, DecodeRate: tt.rate, OutputTokens: tt.tokens, Status: 200}
			if got := DefaultSLO.Met(r); got != tt.want {
				t.Fatalf("Met = %v, want %v (%s)", got, tt.want, DefaultSLO)
			}
		})
	}
	if got, want := DefaultSLO.String(), "TTFT ≤ 2s + 250ms/1k prompt tokens, decode ≥ 15 tok/s"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}
