package predict

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestSLO_Deadline(t *testing.T) {
	s := SLO{TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond}
	tests := []struct {
		name           string
		slo            SLO
		prompt, cached int
		want           time.Duration
	}{
		{"no prompt", s, 0, 0, 2 * time.Second},
		{"uncached prompt counts", s, 4000, 0, 3 * time.Second},
		{"cached tokens do not", s, 4000, 3000, 2250 * time.Millisecond},
		{"cached beyond the prompt", s, 100, 500, 2 * time.Second},
		{"cap", SLO{TTFT: 2 * time.Second, TTFTPer1k: time.Second, MaxTTFT: 3 * time.Second}, 8000, 0, 3 * time.Second},
		{"cap above the objective", SLO{TTFT: time.Second, MaxTTFT: 3 * time.Second}, 0, 0, time.Second},
		{"cap alone", SLO{MaxTTFT: 500 * time.Millisecond}, 1000, 0, 500 * time.Millisecond},
		{"none", SLO{}, 1000, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.slo.Deadline(tt.prompt, tt.cached); got != tt.want {
				t.Fatalf("Deadline(%d, %d) = %v, want %v", tt.prompt, tt.cached, got, tt.want)
			}
		})
	}
}

func TestSLO_OrFillsOnlyUnsetFields(t *testing.T) {
	key := SLO{TTFT: time.Second}
	class := SLO{TTFT: 3 * time.Second, MinDecode: 20, OnMiss: OnMissRefuse}
	got := key.Or(class).Or(FallbackSLO)
	want := SLO{TTFT: time.Second, TTFTPer1k: FallbackSLO.TTFTPer1k, MinDecode: 20, OnMiss: OnMissRefuse}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestTighten(t *testing.T) {
	base := SLO{TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond, MinDecode: 15, OnMiss: OnMissServe}
	tests := []struct {
		name       string
		ttft, dec  string
		wantMax    time.Duration
		wantDecode float64
		wantErr    []string // headers named in the error
	}{
		{name: "no headers", wantDecode: 15},
		{name: "duration", ttft: "800ms", wantMax: 800 * time.Millisecond, wantDecode: 15},
		{name: "milliseconds", ttft: "1500", wantMax: 1500 * time.Millisecond, wantDecode: 15},
		{name: "fractional milliseconds", ttft: "2.5", wantMax: 2500 * time.Microsecond, wantDecode: 15},
		{name: "higher floor", dec: "30", wantDecode: 30},
		{name: "lower floor is ignored", dec: "5", wantDecode: 15},
		{name: "both", ttft: "1s", dec: "20.5", wantMax: time.Second, wantDecode: 20.5},
		{name: "malformed duration", ttft: "fast", wantDecode: 15, wantErr: []string{HeaderTTFTSLO}},
		{name: "zero", ttft: "0", wantDecode: 15, wantErr: []string{HeaderTTFTSLO}},
		{name: "negative", ttft: "-1s", wantDecode: 15, wantErr: []string{HeaderTTFTSLO}},
		{name: "infinite", ttft: "Inf", wantDecode: 15, wantErr: []string{HeaderTTFTSLO}},
		{name: "malformed rate", dec: "lots", wantDecode: 15, wantErr: []string{HeaderMinDecode}},
		{name: "NaN rate", dec: "NaN", wantDecode: 15, wantErr: []string{HeaderMinDecode}},
		{name: "zero rate", dec: "0", wantDecode: 15, wantErr: []string{HeaderMinDecode}},
		{name: "both malformed", ttft: "soon", dec: "-3", wantDecode: 15, wantErr: []string{HeaderTTFTSLO, HeaderMinDecode}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.ttft != "" {
				h.Set(HeaderTTFTSLO, tt.ttft)
			}
			if tt.dec != "" {
				h.Set(HeaderMinDecode, tt.dec)
			}
			got, err := Tighten(base, h.Get)
			if got.MaxTTFT != tt.wantMax || got.MinDecode != tt.wantDecode {
				t.Errorf("got max %v decode %v, want %v and %v", got.MaxTTFT, got.MinDecode, tt.wantMax, tt.wantDecode)
			}
			if got.TTFT != base.TTFT || got.TTFTPer1k != base.TTFTPer1k || got.OnMiss != base.OnMiss {
				t.Errorf("header changed a field it does not set: %+v", got)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var he *HeaderError
			if !errors.As(err, &he) {
				t.Fatalf("error %v is not a *HeaderError", err)
			}
			for _, name := range tt.wantErr {
				v := h.Get(name)
				if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), `"`+v+`"`) {
					t.Errorf("error %q does not name %s and its value %q", err, name, v)
				}
			}
		})
	}
}

func TestTighten_NeverLoosens(t *testing.T) {
	base := SLO{TTFT: time.Second, MaxTTFT: 700 * time.Millisecond, MinDecode: 15}
	h := http.Header{HeaderTTFTSLO: {"5s"}, HeaderMinDecode: {"1"}}
	got, err := Tighten(base, h.Get)
	if err != nil {
		t.Fatal(err)
	}
	if got != base {
		t.Fatalf("looser headers changed the SLO: %+v, want %+v", got, base)
	}
}

func TestSLO_Problems(t *testing.T) {
	bad := SLO{TTFT: -time.Second, TTFTPer1k: -1, MinDecode: -2, OnMiss: "drop"}
	var keys []string
	for _, p := range bad.Problems() {
		keys = append(keys, p.Key)
	}
	if got, want := strings.Join(keys, ","), "ttft,ttft_per_1k_prompt_tokens,min_decode_tok_s,on_miss"; got != want {
		t.Fatalf("problems at %s, want %s", got, want)
	}
	if ps := (SLO{}).Problems(); len(ps) != 0 {
		t.Fatalf("the unset SLO has problems: %v", ps)
	}
}

func TestDefaultSLO(t *testing.T) {
	tests := []struct {
		name  string
		fleet []Unloaded
		want  SLO
	}{
		{"no history: the fallback", nil, FallbackSLO},
		{"nothing known: the fallback", []Unloaded{{}, {}}, FallbackSLO},
		{
			// Fast cards keep the plain SLO: fixed parts 30, 60 and 15 ms
			// (median 30, doubled: under 2 s); slowest prefill 300 ms/1k,
			// doubled to 600 ms, over 250 ms: relaxed; slowest solo decode
			// 50 tok/s, halved to 25, over 15: kept at 15.
			"three fast cards",
			[]Unloaded{
				{Overhead: 10 * time.Millisecond, PrefillPer1k: 200 * time.Millisecond, SoloDecode: 100},
				{Overhead: 20 * time.Millisecond, PrefillPer1k: 300 * time.Millisecond, SoloDecode: 50},
				{Overhead: 5 * time.Millisecond, PrefillPer1k: 100 * time.Millisecond, SoloDecode: 200},
			},
			SLO{TTFT: 2 * time.Second, TTFTPer1k: 600 * time.Millisecond, MinDecode: 15, OnMiss: OnMissServe},
		},
		{
			// Slow cards relax it: fixed parts 1.2 s and 1.6 s (mean of
			// the middle two 1.4 s, doubled to 2.8 s); solo 20 tok/s halved.
			"slow cards: mean of the middle two",
			[]Unloaded{{Overhead: 1100 * time.Millisecond, SoloDecode: 20}, {Overhead: 1500 * time.Millisecond, SoloDecode: 20}},
			SLO{TTFT: 2800 * time.Millisecond, TTFTPer1k: FallbackSLO.TTFTPer1k, MinDecode: 10, OnMiss: OnMissServe},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultSLO(tt.fleet); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
