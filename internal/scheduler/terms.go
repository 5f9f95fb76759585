package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// Weights are the multipliers of the score terms. All are magnitudes (not
// negative); the throughput term is a reward and is subtracted.
type Weights struct {
	ActiveRequests float64 `yaml:"active_requests" json:"active_requests"`
	QueueLength    float64 `yaml:"queue_length" json:"queue_length"`
	Latency        float64 `yaml:"latency" json:"latency"`
	JobCost        float64 `yaml:"job_cost" json:"job_cost"`
	Throughput     float64 `yaml:"throughput" json:"throughput"`
	KVPressure     float64 `yaml:"kv_pressure" json:"kv_pressure"`
	GPUUtil        float64 `yaml:"gpu_util" json:"gpu_util"`
	// Prefix rewards a worker expected to hold the request's prompt
	// prefix in KV cache (a reward, subtracted; see prefixMatch).
	Prefix float64 `yaml:"prefix" json:"prefix"`
}

// DefaultWeights returns the weights Sluice ships with.
func DefaultWeights() Weights {
	return Weights{ActiveRequests: 100, QueueLength: 10, Latency: 5, JobCost: 2, Throughput: 3, KVPressure: 15, GPUUtil: 15, Prefix: 50}
}

// Candidate is what a term sees of one eligible worker at decision time.
type Candidate struct {
	// Name is the worker's name.
	Name string
	// Active is Sluice's in-flight count on the worker.
	Active int
	// JobCost is the estimated outstanding work in tokens: for each
	// request in flight, its prompt plus its expected output.
	JobCost float64
	// Snap is the worker's latest telemetry.
	Snap *snapshot.Snapshot
	// Stats is what Sluice has measured of the worker.
	Stats *stats.WorkerStats
	// Belief is how much of the request's prompt prefix the worker is
	// believed to hold in KV cache, and who says so.
	Belief
}

// Env is what a term sees of the decision besides the candidates: the
// time, how old telemetry may be before it loses weight, and the request.
type Env struct {
	// Now is the time of the decision.
	Now time.Time
	// StaleAfter is the age past which a telemetry reading starts to lose
	// weight (see confidence); 0 means readings never go stale.
	StaleAfter time.Duration
	// Req is the request being placed.
	Req *Request
}

// Term is one part of the score. Score sees every eligible candidate at
// once, so it can normalise across them, and writes raw[i] and norm[i];
// the weight multiplies norm. Provenance says where a raw value came
// from, and is called only when a decision record is read.
type Term interface {
	// Name identifies the term in records and config.
	Name() string
	// Reward reports whether the weighted term is subtracted.
	Reward() bool
	// Score computes the term for every candidate.
	Score(env *Env, cands []Candidate, raw, norm []float64)
	// Provenance returns the source of c's raw value, when it was measured
	// (zero: computed now), and whether it is a neutral stand-in.
	Provenance(env *Env, c *Candidate) (source string, at time.Time, neutral bool)
}

// activeRequests is the number of requests Sluice has in flight on the
// worker, absolute, so that "everyone has 3" does not look idle.
type activeRequests struct{}

func (activeRequests) Name() string { return "active_requests" }
func (activeRequests) Reward() bool { return false }
func (activeRequests) Score(_ *Env, c []Candidate, raw, norm []float64) {
	for i := range c {
		raw[i] = float64(c[i].Active)
		norm[i] = raw[i]
	}
}
func (activeRequests) Provenance(*Env, *Candidate) (string, time.Time, bool) {
	return "sluice in-flight count", time.Time{}, false
}

// scraped is a term scoring one telemetry reading (which): the worker's
// own queue, its KV cache use or its GPU's utilisation. Missing or stale
// readings are neutral (telemetryTerm), fallback when nobody reports one.
type scraped struct {
	name     string
	which    uint8
	fallback float64
}

func (t scraped) Name() string { return t.name }
func (scraped) Reward() bool   { return false }
func (t scraped) Score(env *Env, c []Candidate, raw, norm []float64) {
	telemetryTerm(env, c, raw, norm, t.which, t.fallback)
}
func (t scraped) Provenance(env *Env, c *Candidate) (string, time.Time, bool) {
	return readingProvenance(env, *readingOf(c.Snap, t.which))
}

// The telemetry readings a term scores, as constants so the loop over
// candidates calls no function value.
const (
	readQueue uint8 = iota
	readKV
	readGPU
)

func readingOf(s *snapshot.Snapshot, which uint8) *snapshot.Reading {
	switch which {
	case readQueue:
		return &s.QueueLen
	case readKV:
		return &s.KVPressure
	}
	return &s.GPUUtil
}

func scaleReading(which uint8, v float64) float64 {
	if which == readQueue {
		return max(v, 0)
	}
	return clamp01(v)
}

// confidence is how much a telemetry reading is trusted: 1 while fresher
// than StaleAfter, falling linearly to 0 at three times that age, and 0
// for a reading never made, so a dead scrape stops steering decisions.
func confidence(env *Env, r *snapshot.Reading) float64 {
	if !r.Known() {
		return 0
	}
	if env == nil || env.StaleAfter <= 0 {
		return 1
	}
	age := env.Now.Sub(r.At)
	if age <= env.StaleAfter {
		return 1
	}
	return clamp01(float64(3*env.StaleAfter-age) / float64(2*env.StaleAfter))
}

// telemetryTerm scores a scraped reading: the scaled reading blended with
// a neutral value by its confidence. The neutral value is the
// confidence-weighted mean of the candidates' readings, else fallback.
func telemetryTerm(env *Env, c []Candidate, raw, norm []float64, which uint8, fallback float64) {
	sum, wsum := 0.0, 0.0
	for i := range c {
		r := readingOf(c[i].Snap, which)
		raw[i] = r.Value
		w := confidence(env, r)
		norm[i] = w // the confidence, until the neutral value is known
		if w > 0 {
			sum += w * scaleReading(which, r.Value)
			wsum += w
		}
	}
	neutral := fallback
	if wsum > 0 {
		neutral = sum / wsum
	}
	for i := range c {
		w := norm[i]
		norm[i] = w*scaleReading(which, raw[i]) + (1-w)*neutral
	}
}

// averaged is a term scoring one of Sluice's measured averages (which),
// normalised by ratioToMax: the time to first token (latency) and, a
// reward, the per-stream decode rate (throughput).
type averaged struct {
	name   string
	which  uint8
	reward bool
	label  string // the average's name in records
}

func (t averaged) Name() string { return t.name }
func (t averaged) Reward() bool { return t.reward }
func (t averaged) Score(_ *Env, c []Candidate, raw, norm []float64) {
	ratioToMax(c, raw, norm, t.which)
}
func (t averaged) Provenance(_ *Env, c *Candidate) (string, time.Time, bool) {
	return emaProvenance(c, t.which, t.label)
}

// The measured averages a term scores (constants, as for readings).
const (
	emaTTFT uint8 = iota
	emaDecodeTPS
)

func emaOf(s *stats.WorkerStats, which uint8) *stats.EMA {
	if which == emaTTFT {
		return &s.TTFTMs
	}
	return &s.DecodeTPS
}

// jobCost is the estimated outstanding tokens on the worker, normalised as
// a fraction of the largest among candidates (0 when all are idle).
type jobCost struct{}

func (jobCost) Name() string { return "job_cost" }
func (jobCost) Reward() bool { return false }
func (jobCost) Score(_ *Env, c []Candidate, raw, norm []float64) {
	maxv := 0.0
	for i := range c {
		raw[i] = c[i].JobCost
		maxv = max(maxv, raw[i])
	}
	for i := range c {
		norm[i] = 0
		if maxv > 0 {
			norm[i] = raw[i] / maxv
		}
	}
}
func (jobCost) Provenance(*Env, *Candidate) (string, time.Time, bool) {
	return "sluice outstanding tokens (prompt + expected output)", time.Time{}, false
}

// ratioToMax normalises a measured average as value/max over the
// candidates with history, keeping small differences small (min-max would
// not). A candidate without history gets the mean of the others, or 0.5.
func ratioToMax(c []Candidate, raw, norm []float64, which uint8) {
	maxv := 0.0
	for i := range c {
		e := emaOf(c[i].Stats, which)
		raw[i], norm[i] = e.Value, -1 // -1: no history
		if e.Known() {
			norm[i] = 0
			maxv = max(maxv, e.Value)
		}
	}
	sum, n := 0.0, 0
	for i := range c {
		if norm[i] < 0 {
			continue
		}
		if maxv > 0 {
			norm[i] = raw[i] / maxv
		}
		sum += norm[i]
		n++
	}
	neutral := 0.5
	if n > 0 {
		neutral = sum / float64(n)
	}
	for i := range c {
		if norm[i] < 0 {
			norm[i] = neutral
		}
	}
}

func readingProvenance(env *Env, r snapshot.Reading) (string, time.Time, bool) {
	switch w := confidence(env, &r); {
	case !r.Known():
		return "no telemetry (neutral)", r.At, true
	case w == 0:
		return r.Source + " (too old: neutral)", r.At, true
	case w < 1:
		return fmt.Sprintf("%s (stale: weight %.2f, rest neutral)", r.Source, w), r.At, false
	}
	return r.Source, r.At, false
}

func emaProvenance(c *Candidate, which uint8, name string) (string, time.Time, bool) {
	e := emaOf(c.Stats, which)
	if !e.Known() {
		return name + " (no history: neutral)", time.Time{}, true
	}
	return fmt.Sprintf("%s over %d requests", name, e.N), c.Stats.Updated, false
}

// DefaultTerms returns the terms of Sluice's score, in record order, with
// their weights from w.
func DefaultTerms(w Weights) []WeightedTerm {
	return []WeightedTerm{
		{activeRequests{}, w.ActiveRequests},
		{scraped{"queue_length", readQueue, 0}, w.QueueLength},
		{averaged{"latency", emaTTFT, false, "ema ttft_ms"}, w.Latency},
		{jobCost{}, w.JobCost},
		{averaged{"throughput", emaDecodeTPS, true, "ema decode_tps"}, w.Throughput},
		{scraped{"kv_pressure", readKV, 0.5}, w.KVPressure},
		{scraped{"gpu_util", readGPU, 0.5}, w.GPUUtil},
		{prefixMatch{}, w.Prefix},
	}
}

// WeightedTerm pairs a term with its weight.
type WeightedTerm struct {
	Term   Term
	Weight float64
}

// isTelemetry reports whether a term reads scraped telemetry, whose stale
// readings a record marks.
func isTelemetry(t Term) bool {
	_, ok := t.(scraped)
	return ok
}

func clamp01(v float64) float64 { return min(max(v, 0), 1) }
