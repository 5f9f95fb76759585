package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Arrivals describes a seeded arrival process. The zero value with a Rate
// is a Poisson process.
//
// The process is a renewal process in "operational time" whose intervals
// are gamma distributed with mean 1 and coefficient of variation CV (CV = 1
// is exponential, so Poisson; CV > 1 is bursty), mapped onto wall time
// through a piecewise-constant rate: Rate, raised to Rate×SpikeFactor
// during the spike window, and switched between Rate×(On+Off)/On and 0 by
// the on/off cycle so that the long-run mean stays Rate.
type Arrivals struct {
	// Rate is the mean arrival rate in requests per second.
	Rate float64
	// CV is the coefficient of variation of inter-arrival gaps; 0 means 1.
	CV float64
	// On and Off, when both positive, alternate bursts of On with silences
	// of Off, starting with a burst.
	On, Off time.Duration
	// SpikeAt, SpikeFor and SpikeFactor multiply the rate by SpikeFactor
	// for SpikeFor starting at SpikeAt.
	SpikeAt, SpikeFor time.Duration
	// SpikeFactor is the rate multiplier during the spike (0 or 1 = none).
	SpikeFactor float64
}

// Validate reports a malformed arrival process.
func (a Arrivals) Validate() error {
	var errs []error
	if !(a.Rate > 0) || math.IsInf(a.Rate, 0) {
		errs = append(errs, fmt.Errorf("rate: must be positive, got %v", a.Rate))
	}
	if a.CV < 0 || math.IsNaN(a.CV) || a.CV > 100 {
		errs = append(errs, fmt.Errorf("cv: must be in [0, 100], got %v", a.CV))
	}
	if a.On < 0 || a.Off < 0 || (a.On > 0) != (a.Off > 0) {
		errs = append(errs, fmt.Errorf("on/off: both must be positive or both zero, got %v/%v", a.On, a.Off))
	}
	if a.SpikeFactor < 0 || math.IsNaN(a.SpikeFactor) || a.SpikeAt < 0 || a.SpikeFor < 0 {
		errs = append(errs, fmt.Errorf("spike: factor and times must not be negative"))
	}
	return errors.Join(errs...)
}

// rateAt returns the instantaneous rate at t and the time it next changes.
func (a Arrivals) rateAt(t time.Duration) (rate float64, next time.Duration) {
	rate, next = a.Rate, time.Duration(math.MaxInt64)
	if a.On > 0 && a.Off > 0 {
		period := a.On + a.Off
		phase := t % period
		start := t - phase
		if phase < a.On {
			rate *= float64(period) / float64(a.On)
			next = start + a.On
		} else {
			rate = 0
			next = start + period
		}
	}
	if a.SpikeFactor > 0 && a.SpikeFactor != 1 && a.SpikeFor > 0 {
		end := a.SpikeAt + a.SpikeFor
		switch {
		case t < a.SpikeAt:
			next = min(next, a.SpikeAt)
		case t < end:
			rate *= a.SpikeFactor
			next = min(next, end)
		}
	}
	return rate, next
}

// advance moves from t by d units of operational time (expected arrivals).
func (a Arrivals) advance(t time.Duration, d float64) time.Duration {
	for steps := 0; steps < 1_000_000; steps++ {
		r, next := a.rateAt(t)
		if r > 0 {
			dt := d / r * float64(time.Second)
			if next == time.Duration(math.MaxInt64) || float64(t)+dt <= float64(next) {
				if float64(t)+dt >= float64(math.MaxInt64/2) {
					return time.Duration(math.MaxInt64 / 2)
				}
				return t + time.Duration(dt)
			}
			d -= r * (next - t).Seconds()
		}
		t = next
	}
	return time.Duration(math.MaxInt64 / 2)
}

// Times returns arrival offsets: n of them when n > 0, otherwise all those
// before until. It fails when neither bounds the list.
func (a Arrivals) Times(n int, until time.Duration, seed uint64) ([]time.Duration, error) {
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("arrivals: %w", err)
	}
	if n <= 0 && until <= 0 {
		return nil, errors.New("arrivals: need a count or a duration")
	}
	const maxItems = 10_000_000
	rng := rand.New(rand.NewPCG(seed, 0x617272697661))
	cv := a.CV
	if cv == 0 {
		cv = 1
	}
	shape := 1 / (cv * cv)
	var out []time.Duration
	t := time.Duration(0)
	for len(out) < maxItems {
		gap := gammaSample(rng, shape) / shape // mean 1, CV cv
		t = a.advance(t, gap)
		if until > 0 && t >= until {
			break
		}
		out = append(out, t)
		if n > 0 && len(out) == n {
			break
		}
	}
	if len(out) == maxItems {
		return nil, fmt.Errorf("arrivals: more than %d requests", maxItems)
	}
	return out, nil
}

// gammaSample draws from Gamma(shape, 1) (Marsaglia and Tsang).
func gammaSample(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		// Boost: Gamma(a) = Gamma(a+1) * U^(1/a).
		return gammaSample(rng, shape+1) * math.Pow(1-rng.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := 1 - rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

// Lengths is a clipped lognormal token-length distribution: heavy tailed
// like real prompt and completion lengths.
type Lengths struct {
	// Median is the median length in tokens.
	Median float64
	// Sigma is the standard deviation of the log length; 0 gives a
	// constant Median.
	Sigma float64
	// Min and Max clip the samples.
	Min, Max int
}

// DefaultPromptLengths is a chat-like prompt distribution.
var DefaultPromptLengths = Lengths{Median: 1000, Sigma: 0.8, Min: 16, Max: 8000}

// DefaultOutputLengths is a heavy-tailed completion distribution between
// 10 and 2000 tokens.
var DefaultOutputLengths = Lengths{Median: 150, Sigma: 1.0, Min: 10, Max: 2000}

func (l Lengths) validate() error {
	if !(l.Median > 0) || l.Sigma < 0 || math.IsNaN(l.Sigma) || l.Min < 0 || (l.Max > 0 && l.Max < l.Min) {
		return fmt.Errorf("lengths: need median > 0, sigma >= 0, 0 <= min <= max: %+v", l)
	}
	return nil
}

func (l Lengths) sample(rng *rand.Rand) int {
	v := l.Median * math.Exp(l.Sigma*rng.NormFloat64())
	n := int(math.Round(v))
	if n < l.Min {
		n = l.Min
	}
	if l.Max > 0 && n > l.Max {
		n = l.Max
	}
	return n
}

// CodePromptLengths and CodeOutputLengths are a code-completion load:
// long prompts (median 1,500 tokens, mean about 2,000) and short answers
// (median 13 tokens, mean about 27). It is the traffic on which a router
// that queues to protect decode rates makes every request wait for its
// first token, since each long prefill stalls the streams beside it.
var (
	CodePromptLengths = Lengths{Median: 1500, Sigma: 0.76, Min: 64, Max: 6000}
	CodeOutputLengths = Lengths{Median: 13, Sigma: 1.21, Min: 1, Max: 512}
)

// Synthetic describes a generated load.
type Synthetic struct {
	// Arrivals is the arrival process.
	Arrivals Arrivals
	// Duration bounds the schedule; Count bounds the number of requests.
	// At least one must be set; with both, whichever comes first.
	Duration time.Duration
	// Count is the maximum number of requests (0 = bounded by Duration).
	Count int
	// Prompt and Output are the length distributions; zero values take
	// DefaultPromptLengths and DefaultOutputLengths.
	Prompt, Output Lengths
	// Seed makes the load reproducible.
	Seed uint64
}

// Synthesize generates a load. The same Synthetic always gives the same
// items.
func Synthesize(s Synthetic) ([]Item, error) {
	if s.Count < 0 || s.Duration < 0 {
		return nil, errors.New("synthetic: count and duration must not be negative")
	}
	if s.Prompt == (Lengths{}) {
		s.Prompt = DefaultPromptLengths
	}
	if s.Output == (Lengths{}) {
		s.Output = DefaultOutputLengths
	}
	if err := s.Prompt.validate(); err != nil {
		return nil, fmt.Errorf("synthetic prompt %w", err)
	}
	if err := s.Output.validate(); err != nil {
		return nil, fmt.Errorf("synthetic output %w", err)
	}
	times, err := s.Arrivals.Times(s.Count, s.Duration, s.Seed)
	if err != nil {
		return nil, fmt.Errorf("synthetic: %w", err)
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x6c656e67746873))
	items := make([]Item, len(times))
	for i, at := range times {
		items[i] = Item{At: at, PromptTokens: s.Prompt.sample(rng), OutputTokens: s.Output.sample(rng), Row: i + 1}
	}
	return items, nil
}

// ParseBurst applies a burst specification to a: a comma-separated list of
// "gamma:CV" (bursty renewal arrivals), "onoff:ON:OFF" (bursts of ON every
// ON+OFF) and "spike:AT:FOR:K" (rate × K for FOR starting at AT), e.g.
// "gamma:3,spike:60s:10s:4". The result is validated when it is used.
func ParseBurst(spec string, a Arrivals) (Arrivals, error) {
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, ":")
		bad := func(err error) (Arrivals, error) {
			return a, fmt.Errorf("burst %q: %w", part, err)
		}
		switch f[0] {
		case "gamma":
			if len(f) != 2 {
				return bad(errors.New("want gamma:CV"))
			}
			cv, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return bad(err)
			}
			a.CV = cv
		case "onoff":
			if len(f) != 3 {
				return bad(errors.New("want onoff:ON:OFF"))
			}
			on, err1 := time.ParseDuration(f[1])
			off, err2 := time.ParseDuration(f[2])
			if err := errors.Join(err1, err2); err != nil {
				return bad(err)
			}
			a.On, a.Off = on, off
		case "spike":
			if len(f) != 4 {
				return bad(errors.New("want spike:AT:FOR:K"))
			}
			at, err1 := time.ParseDuration(f[1])
			dur, err2 := time.ParseDuration(f[2])
			k, err3 := strconv.ParseFloat(f[3], 64)
			if err := errors.Join(err1, err2, err3); err != nil {
				return bad(err)
			}
			a.SpikeAt, a.SpikeFor, a.SpikeFactor = at, dur, k
		default:
			return bad(errors.New("want gamma:CV, onoff:ON:OFF or spike:AT:FOR:K"))
		}
	}
	return a, nil
}
