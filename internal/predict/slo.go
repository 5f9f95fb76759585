package predict

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Request headers by which a client tightens its SLO.
const (
	// HeaderTTFTSLO bounds the request's time to first token: a Go
	// duration ("800ms", "1.5s") or a number of milliseconds ("800").
	HeaderTTFTSLO = "X-Sluice-TTFT-SLO"
	// HeaderMinDecode raises the request's per-stream decode floor, in
	// tokens/s ("25").
	HeaderMinDecode = "X-Sluice-Min-Decode"
)

// OnMiss says what to do with a request no worker is predicted to serve
// within its SLO, now or after waiting.
type OnMiss string

const (
	// OnMissServe serves it where the predicted miss is smallest.
	OnMissServe OnMiss = "serve"
	// OnMissRefuse refuses it at once (503 with Retry-After): under
	// overload a request that will miss anyway only delays those that
	// still can make it.
	OnMissRefuse OnMiss = "refuse"
)

// SLO is the promise Sluice tries to keep to a request: its first token
// within Deadline, then at least MinDecode tokens/s. A zero field is
// unset: Or fills it from a base SLO (the class's, then the default).
type SLO struct {
	// TTFT is the fixed part of the time-to-first-token objective.
	TTFT time.Duration `yaml:"ttft" json:"ttft,omitempty"`
	// TTFTPer1k is what the objective allows per 1,000 prompt tokens not
	// expected to be cached on the worker: a long prompt must be
	// prefilled, and no router can make that free.
	TTFTPer1k time.Duration `yaml:"ttft_per_1k_prompt_tokens" json:"ttft_per_1k_prompt_tokens,omitempty"`
	// MaxTTFT caps the objective whatever the prompt; 0 is no cap. It is
	// what the X-Sluice-TTFT-SLO header sets, and not configurable: a
	// client's own bound on the whole wait.
	MaxTTFT time.Duration `yaml:"-" json:"max_ttft,omitempty"`
	// MinDecode is the per-stream decode floor in tokens/s, for this
	// stream and for the streams it would share a worker with.
	MinDecode float64 `yaml:"min_decode_tok_s" json:"min_decode_tok_s,omitempty"`
	// OnMiss is what to do when the SLO is predicted to be missed.
	OnMiss OnMiss `yaml:"on_miss" json:"on_miss,omitempty"`
}

// Deadline returns the time-to-first-token objective of a request of
// promptTokens of which cachedTokens are expected to be found in the
// worker's cache: TTFT + TTFTPer1k·(promptTokens − cachedTokens)/1000,
// capped by MaxTTFT when set. 0 means the SLO sets no TTFT objective.
func (s SLO) Deadline(promptTokens, cachedTokens int) time.Duration {
	uncached := max(promptTokens-max(cachedTokens, 0), 0)
	d := s.TTFT + time.Duration(float64(s.TTFTPer1k)*float64(uncached)/1000)
	if s.MaxTTFT > 0 && (d == 0 || d > s.MaxTTFT) {
		d = s.MaxTTFT
	}
	return d
}

// Or returns s with each unset field taken from base: a key's SLO over
// its class's, a class's over the default.
func (s SLO) Or(base SLO) SLO {
	if s.TTFT == 0 {
		s.TTFT = base.TTFT
	}
	if s.TTFTPer1k == 0 {
		s.TTFTPer1k = base.TTFTPer1k
	}
	if s.MaxTTFT == 0 {
		s.MaxTTFT = base.MaxTTFT
	}
	if s.MinDecode == 0 {
		s.MinDecode = base.MinDecode
	}
	if s.OnMiss == "" {
		s.OnMiss = base.OnMiss
	}
	return s
}

// Problem is one invalid field of an SLO, named by its YAML key.
type Problem struct {
	Key, Msg string
}

// Problems returns what is wrong with s as configured (zero fields are
// unset and fine), one Problem per field, so that config check can report
// them under their key paths.
func (s SLO) Problems() []Problem {
	var ps []Problem
	if s.TTFT < 0 {
		ps = append(ps, Problem{"ttft", fmt.Sprintf("negative (%v); leave it out to take the default", s.TTFT)})
	}
	if s.TTFTPer1k < 0 {
		ps = append(ps, Problem{"ttft_per_1k_prompt_tokens", fmt.Sprintf("negative (%v); leave it out to take the default", s.TTFTPer1k)})
	}
	if s.MinDecode < 0 || math.IsNaN(s.MinDecode) || math.IsInf(s.MinDecode, 0) {
		ps = append(ps, Problem{"min_decode_tok_s", fmt.Sprintf("must be a positive number of tokens/s, got %v", s.MinDecode)})
	}
	if s.OnMiss != "" && s.OnMiss != OnMissServe && s.OnMiss != OnMissRefuse {
		ps = append(ps, Problem{"on_miss", fmt.Sprintf("%q is not serve or refuse", string(s.OnMiss))})
	}
	return ps
}

// HeaderError is a malformed SLO header; the router answers it with 400.
type HeaderError struct {
	Header, Value string
	Reason        string
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("header %s: %q %s", e.Header, e.Value, e.Reason)
}

// Tighten returns s tightened by the request's SLO headers, read with get
// (an http.Header's Get): X-Sluice-TTFT-SLO lowers MaxTTFT, and
// X-Sluice-Min-Decode raises MinDecode. A header can only tighten: a
// looser value than the configured one is ignored, not an error, since
// the client cannot know the configuration. A malformed, zero, negative
// or infinite value is a *HeaderError naming the header and the value.
func Tighten(s SLO, get func(string) string) (SLO, error) {
	var errs []error
	if v := strings.TrimSpace(get(HeaderTTFTSLO)); v != "" {
		d, err := parseTTFT(v)
		if err != nil {
			errs = append(errs, &HeaderError{Header: HeaderTTFTSLO, Value: v, Reason: err.Error()})
		} else if s.MaxTTFT == 0 || d < s.MaxTTFT {
			s.MaxTTFT = d
		}
	}
	if v := strings.TrimSpace(get(HeaderMinDecode)); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		switch {
		case err != nil || math.IsNaN(f) || math.IsInf(f, 0):
			errs = append(errs, &HeaderError{Header: HeaderMinDecode, Value: v, Reason: "is not a number of tokens/s"})
		case f <= 0:
			errs = append(errs, &HeaderError{Header: HeaderMinDecode, Value: v, Reason: "must be positive"})
		case f > s.MinDecode:
			s.MinDecode = f
		}
	}
	return s, errors.Join(errs...)
}

// parseTTFT reads a Go duration or a number of milliseconds.
func parseTTFT(v string) (time.Duration, error) {
	var d time.Duration
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f > float64(math.MaxInt64/int64(time.Millisecond)) {
			return 0, errors.New("is not a duration or a number of milliseconds")
		}
		d = time.Duration(f * float64(time.Millisecond))
	} else {
		d, err = time.ParseDuration(v)
		if err != nil {
			return 0, errors.New("is not a duration (e.g. 800ms, 1.5s) or a number of milliseconds")
		}
	}
	if d <= 0 {
		return 0, errors.New("must be positive")
	}
	return d, nil
}

// Unloaded is what one worker does with nothing else running, as the
// predictor has fitted it (Predictor.Unloaded). A zero field is unknown.
type Unloaded struct {
	// Overhead is the fixed part of its time to first token.
	Overhead time.Duration
	// PrefillPer1k is its prefill time per 1,000 uncached prompt tokens.
	PrefillPer1k time.Duration
	// SoloDecode is its decode rate with one stream, tokens/s.
	SoloDecode float64
}

// FallbackSLO is the plain SLO, used while no worker has any history: 2 s
// plus 250 ms per 1,000 uncached prompt tokens (a prompt prefilled at
// 4,000 tokens/s), then 15 tokens/s, taken as stated, not fitted to
// anything.
var FallbackSLO = SLO{TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond, MinDecode: 15, OnMiss: OnMissServe}

// DefaultSLO is the SLO of a class nobody configured one for: the plain
// SLO (FallbackSLO) relaxed part by part where the fleet cannot keep it
// even unloaded, by a fixed rule that follows the hardware and no trace:
//
//   - TTFT = the larger of 2 s and 2 × the median over workers of
//     (Overhead + 2 decode steps at the solo rate): the fixed cost of a
//     first token, plus the step a request may find in flight and its own;
//   - TTFTPer1k = the larger of 250 ms and 2 × the slowest worker's
//     PrefillPer1k, so any worker may take any prompt at up to half its
//     unloaded prefill speed;
//   - MinDecode = the smaller of 15 tokens/s and half the slowest
//     worker's SoloDecode;
//   - OnMiss = serve.
//
// It is never stricter than the plain SLO: a default derived from an
// idle fleet alone (2 × its unloaded first token, half its solo rate)
// promises what no loaded fleet keeps. Each part is taken over the
// workers that know it.
func DefaultSLO(fleet []Unloaded) SLO {
	s := FallbackSLO
	var fixed []time.Duration
	var slowPrefill time.Duration
	slowDecode := math.Inf(1)
	for _, u := range fleet {
		if u.PrefillPer1k > 0 {
			slowPrefill = max(slowPrefill, u.PrefillPer1k)
		}
		if u.SoloDecode > 0 {
			slowDecode = min(slowDecode, u.SoloDecode)
			if u.Overhead >= 0 {
				fixed = append(fixed, u.Overhead+time.Duration(2*float64(time.Second)/u.SoloDecode))
			}
		}
	}
	if len(fixed) > 0 {
		slices.Sort(fixed)
		m := fixed[len(fixed)/2]
		if len(fixed)%2 == 0 {
			m = (fixed[len(fixed)/2-1] + m) / 2
		}
		s.TTFT = max(s.TTFT, 2*m)
	}
	if slowPrefill > 0 {
		s.TTFTPer1k = max(s.TTFTPer1k, 2*slowPrefill)
	}
	if !math.IsInf(slowDecode, 1) {
		s.MinDecode = min(s.MinDecode, slowDecode/2)
	}
	return s
}
