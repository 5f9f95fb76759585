package telemetry

import (
	"fmt"
	"io"
	"strings"
)

// Metric names vLLM exposes on GET /metrics (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger). Every series carries the labels model_name (the
// served model name) and engine (the engine index under data
// parallelism). vllm:gpu_cache_usage_perc is the name before 0.9, kept
// (deprecated) beside vllm:kv_cache_usage_perc for a few releases; both
// are fractions 0..1 despite the "perc".
const (
	VLLMNumRequestsRunning = "vllm:num_requests_running"
	VLLMNumRequestsWaiting = "vllm:num_requests_waiting"
	VLLMKVCacheUsagePerc   = "vllm:kv_cache_usage_perc"
	VLLMGPUCacheUsagePerc  = "vllm:gpu_cache_usage_perc"
	// VLLMModelLabel is the label that names the served model.
	VLLMModelLabel = "model_name"
)

// ParseVLLM reads vLLM's /metrics for one model.
//
// Selection: when the payload names a single model_name, its series are
// used whatever model says (an alias in Sluice's config still works).
// When it names several, model picks one; an empty model aggregates them
// all, and a model that is not among them is reported missing with the
// names that are. Across the series kept (one per engine under data
// parallelism, or per model when aggregating) running and waiting counts
// are summed and the KV fraction is the largest, since a request may land
// on the fullest engine.
//
// KVUsage comes from vllm:kv_cache_usage_perc, or from the older
// vllm:gpu_cache_usage_perc when the newer name is absent.
//
// Malformed text returns an error wrapping ErrMalformed. Absent metrics
// return the partial Metrics and a *MissingError.
func ParseVLLM(r io.Reader, model string) (Metrics, error) {
	mfs, err := families(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse vllm metrics: %w", err)
	}

	var all []sample
	for _, name := range []string{VLLMNumRequestsRunning, VLLMNumRequestsWaiting, VLLMKVCacheUsagePerc, VLLMGPUCacheUsagePerc} {
		ss, _ := samples(mfs, name)
		all = append(all, ss...)
	}
	models := labelValues(all, VLLMModelLabel)
	var keep func(sample) bool
	if len(models) > 1 && model != "" {
		keep = func(s sample) bool { return s.labels[VLLMModelLabel] == model }
	}

	var miss missing
	m := Metrics{
		Running:  aggregate(mfs, VLLMNumRequestsRunning, keep, sum, &miss),
		QueueLen: aggregate(mfs, VLLMNumRequestsWaiting, keep, sum, &miss),
	}
	var kvMiss missing
	m.KVUsage = aggregate(mfs, VLLMKVCacheUsagePerc, keep, maxFraction, &kvMiss)
	if !m.KVUsage.Present {
		var oldMiss missing
		if old := aggregate(mfs, VLLMGPUCacheUsagePerc, keep, maxFraction, &oldMiss); old.Present {
			m.KVUsage = old
		} else {
			miss.add("%s (nor %s)", kvMiss[0], VLLMGPUCacheUsagePerc)
		}
	}
	if keep != nil && len(miss) > 0 {
		for i := range miss {
			miss[i] += fmt.Sprintf(" for %s=%q (served: %s)", VLLMModelLabel, model, strings.Join(models, ", "))
		}
	}
	if err := miss.err(); err != nil {
		return m, fmt.Errorf("parse vllm metrics: %w", err)
	}
	return m, nil
}
