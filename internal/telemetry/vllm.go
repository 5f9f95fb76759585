package telemetry

import (
	"io"
	"strconv"
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

// What vLLM says of its prefix cache and KV cache size. The counters are
// declared in vllm/v1/metrics/loggers.py as prometheus_client Counters
// named vllm:prefix_cache_queries ("Prefix cache queries, in terms of
// number of queried tokens.") and vllm:prefix_cache_hits ("Prefix cache
// hits, in terms of number of cached tokens."); prometheus_client exposes
// a Counter with "_total" appended, which is the name on the wire (and in
// docs.vllm.ai's metrics design page, docs/design/metrics.md). Before
// them the same counts were vllm:gpu_prefix_cache_queries/_hits (now
// deprecated). vllm:cache_config_info is an info gauge (value 1) whose
// labels are the engine's CacheConfig, among them block_size (tokens per
// KV block) and num_gpu_blocks; one series per engine under data
// parallelism.
const (
	VLLMPrefixCacheQueries    = "vllm:prefix_cache_queries_total"
	VLLMPrefixCacheHits       = "vllm:prefix_cache_hits_total"
	VLLMGPUPrefixCacheQueries = "vllm:gpu_prefix_cache_queries_total"
	VLLMGPUPrefixCacheHits    = "vllm:gpu_prefix_cache_hits_total"
	VLLMCacheConfigInfo       = "vllm:cache_config_info"
)

// PrefixCache is what a worker's metrics say about its prefix cache:
// cumulative counts of prompt tokens looked up and found (so a hit rate
// is a ratio of two scrapes' differences), and the KV cache's size.
// Absent values are zero Values (Present false); they are optional and
// never reported missing, since older servers and servers with prefix
// caching off have none.
type PrefixCache struct {
	// Queries is the cumulative count of prompt tokens looked up in the
	// prefix cache.
	Queries Value `json:"queries"`
	// Hits is the cumulative count of those tokens found cached.
	Hits Value `json:"hits"`
	// KVTokens is the KV cache's capacity in tokens: num_gpu_blocks ×
	// block_size, summed over engines.
	KVTokens Value `json:"kv_tokens"`
	// KVPoolTokens is the KV cache one request draws from: the smallest
	// engine's num_gpu_blocks × block_size (a request runs on one engine
	// under data parallelism).
	KVPoolTokens Value `json:"kv_pool_tokens"`
}

// parseVLLMPrefixCache reads the prefix-cache counters of the kept series
// (summed over engines) and the KV cache size from vllm:cache_config_info.
func parseVLLMPrefixCache(mfs familyMap, keep func(sample) bool) PrefixCache {
	var pc PrefixCache
	for _, names := range [][2]string{{VLLMPrefixCacheQueries, VLLMPrefixCacheHits}, {VLLMGPUPrefixCacheQueries, VLLMGPUPrefixCacheHits}} {
		q := aggregate(mfs, names[0], keep, sum, nil)
		h := aggregate(mfs, names[1], keep, sum, nil)
		if q.Present && h.Present {
			pc.Queries, pc.Hits = q, h
			break
		}
	}
	ss, _ := samples(mfs, VLLMCacheConfigInfo)
	tokens, pool := 0.0, 0.0
	for _, s := range ss {
		blocks, err1 := strconv.ParseFloat(s.labels["num_gpu_blocks"], 64)
		size, err2 := strconv.ParseFloat(s.labels["block_size"], 64)
		if err1 != nil || err2 != nil || !finite(blocks) || !finite(size) || blocks <= 0 || size <= 0 {
			continue // "None" before the engine has profiled its memory
		}
		tokens += blocks * size
		if pool == 0 || blocks*size < pool {
			pool = blocks * size
		}
	}
	if tokens > 0 {
		pc.KVTokens = Value{V: tokens, Present: true, Metric: VLLMCacheConfigInfo + " num_gpu_blocks×block_size"}
		pc.KVPoolTokens = Value{V: pool, Present: true, Metric: VLLMCacheConfigInfo + " num_gpu_blocks×block_size, smallest engine"}
	}
	return pc
}

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
// vllm:gpu_cache_usage_perc when the newer name is absent. PrefixCache
// carries the prefix-cache counters and the KV cache size when the
// payload has them (see PrefixCache; never reported missing).
//
// Malformed text returns an error wrapping ErrMalformed. Absent metrics
// return the partial Metrics and a *MissingError.
func ParseVLLM(r io.Reader, model string) (Metrics, error) {
	return parseProm(r, "vllm", func(mfs familyMap, miss *missing) (Metrics, error) {
		keep, models := modelFilter(mfs, []string{VLLMNumRequestsRunning, VLLMNumRequestsWaiting, VLLMKVCacheUsagePerc, VLLMGPUCacheUsagePerc}, VLLMModelLabel, model)
		m := Metrics{
			Running:  aggregate(mfs, VLLMNumRequestsRunning, keep, sum, miss),
			QueueLen: aggregate(mfs, VLLMNumRequestsWaiting, keep, sum, miss),
		}
		var kvMiss missing
		m.KVUsage = aggregate(mfs, VLLMKVCacheUsagePerc, keep, maxFraction, &kvMiss)
		if !m.KVUsage.Present {
			if old := aggregate(mfs, VLLMGPUCacheUsagePerc, keep, maxFraction, nil); old.Present {
				m.KVUsage = old
			} else {
				miss.add("%s (nor %s)", kvMiss[0], VLLMGPUCacheUsagePerc)
			}
		}
		m.PrefixCache = parseVLLMPrefixCache(mfs, keep)
		if keep != nil {
			miss.forModel(VLLMModelLabel, model, models)
		}
		return m, nil
	})
}
