package telemetry

import (
	"io"
	"slices"
)

// Metric names llama.cpp's server exposes on GET /metrics (started with
// --metrics). The names are those of tools/server in ggml-org/llama.cpp
// (formerly examples/server): every series is unlabelled and typed gauge
// or counter (testdata/README.md quotes the source).
//
// Older builds exported llamacpp:kv_cache_usage_ratio ("KV-cache usage. 1
// means 100 percent usage.") and llamacpp:kv_cache_tokens ("KV-cache
// tokens."). Current builds (server_task_result_metrics::to_metrics in
// tools/server/server-task.cpp) export neither, nor any other KV-cache
// series: both are optional, read when there and never reported missing.
// Against a current build the KV pressure comes from /slots instead (see
// Slots.KVUsage).
const (
	LlamaCPPRequestsProcessing = "llamacpp:requests_processing"
	LlamaCPPRequestsDeferred   = "llamacpp:requests_deferred"
	// LlamaCPPKVCacheUsageRatio is the fraction of KV cells in use,
	// cached prompts of idle slots included (older builds only).
	LlamaCPPKVCacheUsageRatio = "llamacpp:kv_cache_usage_ratio"
	// LlamaCPPKVCacheTokens is the cells in use (older builds only).
	LlamaCPPKVCacheTokens = "llamacpp:kv_cache_tokens"
)

// ParseLlamaCPP reads llama.cpp's /metrics. Running comes from
// llamacpp:requests_processing, QueueLen from llamacpp:requests_deferred
// (requests waiting for a free slot); both are exported by every build and
// reported missing when absent. KVUsage comes from
// llamacpp:kv_cache_usage_ratio and KVUsedTokens from
// llamacpp:kv_cache_tokens when the build exports them; their absence is
// no error, since current builds have none (KVUsage is then absent, not
// zero). Should a proxy add labels and several series appear, counts are
// summed and the KV fraction is the largest.
//
// Malformed text returns an error wrapping ErrMalformed (and the
// expfmt.ParseError with its line). Absent required metrics return the
// partial Metrics and a *MissingError; a KV series that is present but not
// a finite number is reported too, since that is a broken payload rather
// than an older or newer build.
func ParseLlamaCPP(r io.Reader) (Metrics, error) {
	return parseProm(r, "llama.cpp", func(mfs familyMap, miss *missing) (Metrics, error) {
		m := Metrics{
			Running:  aggregate(mfs, LlamaCPPRequestsProcessing, nil, sum, miss),
			QueueLen: aggregate(mfs, LlamaCPPRequestsDeferred, nil, sum, miss),
			KVUsage:  Value{Metric: LlamaCPPKVCacheUsageRatio},
		}
		if _, ok := mfs[LlamaCPPKVCacheUsageRatio]; ok {
			m.KVUsage = aggregate(mfs, LlamaCPPKVCacheUsageRatio, nil, maxFraction, miss)
		}
		if v := aggregate(mfs, LlamaCPPKVCacheTokens, nil, sum, nil); v.Present {
			m.KVUsedTokens = v
		}
		return m, nil
	})
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

func maxFraction(vs []float64) float64 { return clamp01(slices.Max(vs)) }

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
