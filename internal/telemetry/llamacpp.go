package telemetry

import (
	"fmt"
	"io"
)

// Metric names llama.cpp's server exposes on GET /metrics (started with
// --metrics). The names are those of tools/server in ggml-org/llama.cpp
// (formerly examples/server): every series is unlabelled and typed gauge
// or counter. llamacpp:kv_cache_usage_ratio ("KV-cache usage. 1 means 100
// percent usage.") was dropped by newer builds, whose README no longer
// lists it; against those KVUsage is reported missing.
const (
	LlamaCPPRequestsProcessing = "llamacpp:requests_processing"
	LlamaCPPRequestsDeferred   = "llamacpp:requests_deferred"
	LlamaCPPKVCacheUsageRatio  = "llamacpp:kv_cache_usage_ratio"
	// LlamaCPPKVCacheTokens ("KV-cache tokens.") is the cells in use,
	// dropped by newer builds with the ratio; optional.
	LlamaCPPKVCacheTokens = "llamacpp:kv_cache_tokens"
)

// ParseLlamaCPP reads llama.cpp's /metrics. Running comes from
// llamacpp:requests_processing, QueueLen from llamacpp:requests_deferred
// (requests waiting for a free slot) and KVUsage from
// llamacpp:kv_cache_usage_ratio; KVUsedTokens from llamacpp:kv_cache_tokens
// when present (never reported missing). Should a proxy add labels and several
// series appear, counts are summed and the KV fraction is the largest.
//
// Malformed text returns an error wrapping ErrMalformed (and the
// expfmt.ParseError with its line). Absent metrics return the partial
// Metrics and a *MissingError.
func ParseLlamaCPP(r io.Reader) (Metrics, error) {
	mfs, err := families(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse llama.cpp metrics: %w", err)
	}
	var miss missing
	m := Metrics{
		Running:  aggregate(mfs, LlamaCPPRequestsProcessing, nil, sum, &miss),
		QueueLen: aggregate(mfs, LlamaCPPRequestsDeferred, nil, sum, &miss),
		KVUsage:  aggregate(mfs, LlamaCPPKVCacheUsageRatio, nil, maxFraction, &miss),
	}
	var optional missing
	if v := aggregate(mfs, LlamaCPPKVCacheTokens, nil, sum, &optional); v.Present {
		m.KVUsedTokens = v
	}
	if err := miss.err(); err != nil {
		return m, fmt.Errorf("parse llama.cpp metrics: %w", err)
	}
	return m, nil
}

// combine folds the values of several series into one.
type combine func([]float64) float64

func sum(vs []float64) float64 {
	var s float64
	for _, v := range vs {
		s += v
	}
	return max(s, 0)
}

func maxFraction(vs []float64) float64 {
	m := vs[0]
	for _, v := range vs[1:] {
		m = max(m, v)
	}
	return clamp01(m)
}

// aggregate reads the family name, keeps the series keep accepts (all when
// keep is nil), folds their finite values with fn and records an absence
// in miss.
func aggregate(mfs familyMap, name string, keep func(sample) bool, fn combine, miss *missing) Value {
	v := Value{Metric: name}
	ss, ok := samples(mfs, name)
	if !ok {
		miss.add("%s", name)
		return v
	}
	var vals []float64
	nonFinite := false
	for _, s := range ss {
		if keep != nil && !keep(s) {
			continue
		}
		if !finite(s.value) {
			nonFinite = true
			continue
		}
		vals = append(vals, s.value)
	}
	if len(vals) == 0 {
		if nonFinite {
			miss.add("%s (not a finite number)", name)
		} else {
			miss.add("%s (no matching series)", name)
		}
		return v
	}
	v.V, v.Present = fn(vals), true
	return v
}
