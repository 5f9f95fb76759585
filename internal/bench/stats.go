package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Percentile returns the nearest-rank p-th percentile (0 ≤ p ≤ 100) of
// sorted, which must be in ascending order: sorted[ceil(p/100·n)−1], with
// p = 0 giving the minimum. It returns NaN for an empty slice.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 || math.IsNaN(p) {
		return math.NaN()
	}
	p = min(max(p, 0), 100)
	// Round p·n/100 to 9 decimals first so that, say, p90 of 10 samples is
	// rank 9 rather than 10 because 0.9*10 is 9.000000000000002.
	rank := int(math.Ceil(math.Round(p*float64(n)/100*1e9) / 1e9))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// Dist summarises a latency distribution in milliseconds.
type Dist struct {
	// N is the number of samples.
	N int `json:"n"`
	// Mean, P50, P90, P99 and Max are in milliseconds.
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	// TailRatio is P99/P50, the predictability figure Sluice is built to
	// lower; 0 when P50 is 0.
	TailRatio float64 `json:"p99_over_p50"`
}

func newDist(v []float64) Dist {
	if len(v) == 0 {
		return Dist{}
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	d := Dist{N: len(s), Mean: mean(s), P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99), Max: s[len(s)-1]}
	if d.P50 > 0 {
		d.TailRatio = d.P99 / d.P50
	}
	return d
}

// RateDist summarises per-request decode rates in tokens per second, where
// the low end matters: a worker that decodes slowly for some requests is an
// unpredictable worker.
type RateDist struct {
	// N is the number of requests with at least two output tokens.
	N int `json:"n"`
	// Mean, P1, P5 and P50 are tokens per second.
	Mean float64 `json:"mean"`
	P1   float64 `json:"p1"`
	P5   float64 `json:"p5"`
	P50  float64 `json:"p50"`
	// CV is the coefficient of variation: population standard deviation
	// divided by the mean.
	CV float64 `json:"cv"`
}

func newRateDist(v []float64) RateDist {
	if len(v) == 0 {
		return RateDist{}
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return RateDist{N: len(s), Mean: mean(s), P1: Percentile(s, 1), P5: Percentile(s, 5), P50: Percentile(s, 50), CV: cv(s)}
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// cv is the population standard deviation over the mean (0 if mean is 0).
func cv(v []float64) float64 {
	m := mean(v)
	if m == 0 {
		return 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return math.Sqrt(ss/float64(len(v))) / m
}

// SLO is a per-request service-level objective. A zero bound is not
// checked.
type SLO struct {
	// TTFT bounds time to first token.
	TTFT time.Duration `json:"ttft_ns"`
	// TTFTPer1kPrompt adds to the TTFT bound for every 1,000 prompt
	// tokens: a long prompt takes longer to prefill.
	TTFTPer1kPrompt time.Duration `json:"ttft_per_1k_prompt_ns"`
	// TPOT bounds time per output token. Requests with fewer than two
	// tokens have no TPOT and pass this bound.
	TPOT time.Duration `json:"tpot_ns"`
	// MinDecodeTokS is the per-stream decode-rate floor in tokens/s,
	// after the first token; requests with fewer than two tokens pass.
	MinDecodeTokS float64 `json:"min_decode_tok_s"`
}

// DefaultSLO is the objective `sluice bench compare` judges every policy
// and trace by, stated before measuring: the first token within 2 s plus
// a quarter of a second per 1,000 prompt tokens (prefill at 4,000
// tokens/s), then at least 15 tokens/s. It is what a user of a chat or
// coding tool notices, and the same for every trace.
var DefaultSLO = SLO{TTFT: 2 * time.Second, TTFTPer1kPrompt: 250 * time.Millisecond, MinDecodeTokS: 15}

// TTFTBound returns the TTFT bound for a prompt of n tokens; 0 when TTFT
// is not bounded.
func (s SLO) TTFTBound(n int) time.Duration {
	if s.TTFT <= 0 {
		return 0
	}
	return s.TTFT + time.Duration(float64(s.TTFTPer1kPrompt)*float64(n)/1000)
}

// Met reports whether a successful result meets the SLO. Failed requests
// never meet it.
func (s SLO) Met(r Result) bool {
	if !r.OK() {
		return false
	}
	if b := s.TTFTBound(r.PromptTokens); b > 0 && r.TTFT > b {
		return false
	}
	if s.TPOT > 0 && r.OutputTokens >= 2 && r.TPOT > s.TPOT {
		return false
	}
	if s.MinDecodeTokS > 0 && r.OutputTokens >= 2 && r.DecodeRate > 0 && r.DecodeRate < s.MinDecodeTokS {
		return false
	}
	return true
}

// String describes the SLO, e.g. "TTFT ≤ 2s + 250ms/1k prompt tokens,
// decode ≥ 15 tok/s".
func (s SLO) String() string {
	var parts []string
	switch {
	case s.TTFT > 0 && s.TTFTPer1kPrompt > 0:
		parts = append(parts, fmt.Sprintf("TTFT ≤ %v + %v/1k prompt tokens", s.TTFT, s.TTFTPer1kPrompt))
	case s.TTFT > 0:
		parts = append(parts, fmt.Sprintf("TTFT ≤ %v", s.TTFT))
	}
	if s.TPOT > 0 {
		parts = append(parts, fmt.Sprintf("TPOT ≤ %v", s.TPOT))
	}
	if s.MinDecodeTokS > 0 {
		parts = append(parts, fmt.Sprintf("decode ≥ %g tok/s", s.MinDecodeTokS))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Summary is what a run amounts to.
type Summary struct {
	// Count is the number of requests scheduled; OK the number that
	// succeeded; Errors the rest.
	Count  int `json:"count"`
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	// ErrorsByKind counts failures by kind, with the status for HTTP
	// failures ("refused 429", "http 500", "timeout", ...).
	ErrorsByKind map[string]int `json:"errors_by_kind,omitempty"`
	// Refusals counts 429/503 refusals by their X-Sluice-Reason.
	Refusals map[string]int `json:"refusals,omitempty"`
	// Span is from the first send to the last completion; the throughput
	// figures divide by it.
	Span time.Duration `json:"span_ns"`
	// RequestsPerSec counts successful requests; OutputTokensPerSec their
	// output tokens.
	RequestsPerSec     float64 `json:"requests_per_s"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// PromptCached is the fraction of successful requests' prompt tokens
	// found in a worker's prefix cache (Result.CachedTokens).
	PromptCached float64 `json:"prompt_cached"`
	// TTFT, E2E and TPOT are over successful requests (TPOT over those
	// with at least two tokens), in milliseconds.
	TTFT Dist `json:"ttft_ms"`
	E2E  Dist `json:"e2e_ms"`
	TPOT Dist `json:"tpot_ms"`
	// DecodeRate is the spread of per-request decode tokens per second.
	DecodeRate RateDist `json:"decode_tokens_per_s"`
	// SLO is the objective goodput is measured against.
	SLO SLO `json:"slo"`
	// Goodput is successful requests meeting the SLO per second of Span;
	// Attainment is their fraction of Count.
	Goodput    float64 `json:"goodput_per_s"`
	Attainment float64 `json:"slo_attainment"`
	// Lateness is how late requests were sent against their schedule, in
	// milliseconds: a large p99 means the load generator could not keep up
	// and the run is not open-loop.
	Lateness Dist `json:"send_lateness_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Summarize reduces results to a Summary against slo.
func Summarize(results []Result, slo SLO) Summary {
	s := Summary{Count: len(results), SLO: slo}
	var ttft, e2e, tpot, rate, late []float64
	var first, last time.Duration
	var tokens, good, prompt, cached int
	for i, r := range results {
		if i == 0 || r.Start < first {
			first = r.Start
		}
		if end := r.Start + r.E2E; i == 0 || end > last {
			last = end
		}
		if r.Kind != KindCapped {
			late = append(late, ms(r.Lateness))
		}
		if !r.OK() {
			s.Errors++
			if s.ErrorsByKind == nil {
				s.ErrorsByKind = map[string]int{}
			}
			s.ErrorsByKind[r.KindLabel()]++
			if r.Kind == KindRefused {
				if s.Refusals == nil {
					s.Refusals = map[string]int{}
				}
				reason := r.Reason
				if reason == "" {
					reason = "unstated"
				}
				s.Refusals[reason]++
			}
			continue
		}
		s.OK++
		tokens += r.OutputTokens
		prompt += r.PromptTokens
		cached += r.CachedTokens
		ttft = append(ttft, ms(r.TTFT))
		e2e = append(e2e, ms(r.E2E))
		if r.OutputTokens >= 2 {
			tpot = append(tpot, ms(r.TPOT))
			if r.DecodeRate > 0 {
				rate = append(rate, r.DecodeRate)
			}
		}
		if slo.Met(r) {
			good++
		}
	}
	s.TTFT, s.E2E, s.TPOT = newDist(ttft), newDist(e2e), newDist(tpot)
	s.DecodeRate = newRateDist(rate)
	s.Lateness = newDist(late)
	if prompt > 0 {
		s.PromptCached = float64(cached) / float64(prompt)
	}
	if len(results) > 0 {
		s.Span = last - first
		s.Attainment = float64(good) / float64(len(results))
	}
	if sec := s.Span.Seconds(); sec > 0 {
		s.RequestsPerSec = float64(s.OK) / sec
		s.OutputTokensPerSec = float64(tokens) / sec
		s.Goodput = float64(good) / sec
	}
	return s
}
