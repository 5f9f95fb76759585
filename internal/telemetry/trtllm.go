package telemetry

import (
	"encoding/json"
	"fmt"
	"io"
)

// Fields of the iteration statistics trtllm-serve answers on GET /metrics
// (docs/source/commands/trtllm-serve.rst, "Metrics Endpoint"): a JSON array
// with one object per engine iteration since the last poll. The server
// queues them and drops what it hands out, so each poll sees only new
// iterations; with the PyTorch backend they exist only when
// enable_iter_perf_stats is set.
const (
	TRTLLMNumActiveRequests = "numActiveRequests"
	TRTLLMNumQueuedRequests = "numQueuedRequests"
	TRTLLMKVCacheUsedBlocks = "kvCacheStats.usedNumBlocks/maxNumBlocks"
)

// ParseTRTLLMStats reads trtllm-serve's /metrics and returns what its
// latest iteration (the last element) says: Running from
// numActiveRequests, QueueLen from numQueuedRequests, KVUsage from
// kvCacheStats.usedNumBlocks / kvCacheStats.maxNumBlocks.
//
// An empty array means no iteration ran since the last poll (an idle
// engine), or that iteration statistics are switched off: the parser
// cannot tell which, so every value is reported missing rather than
// zero. Malformed JSON returns an error wrapping ErrMalformed.
func ParseTRTLLMStats(r io.Reader) (Metrics, error) {
	var iters []json.RawMessage
	if err := decodeJSON(r, &iters); err != nil {
		return Metrics{}, fmt.Errorf("parse trtllm metrics: %w", err)
	}
	m := Metrics{
		Running:  Value{Metric: TRTLLMNumActiveRequests},
		QueueLen: Value{Metric: TRTLLMNumQueuedRequests},
		KVUsage:  Value{Metric: TRTLLMKVCacheUsedBlocks},
	}
	if len(iters) == 0 {
		return m, fmt.Errorf("parse trtllm metrics: %w", &MissingError{Metrics: []string{
			"every value (no iteration since the last poll: idle, or enable_iter_perf_stats off)",
		}})
	}
	var it struct {
		NumActiveRequests *float64 `json:"numActiveRequests"`
		NumQueuedRequests *float64 `json:"numQueuedRequests"`
		KVCacheStats      *struct {
			UsedNumBlocks *float64 `json:"usedNumBlocks"`
			MaxNumBlocks  *float64 `json:"maxNumBlocks"`
		} `json:"kvCacheStats"`
	}
	if err := json.Unmarshal(iters[len(iters)-1], &it); err != nil {
		return Metrics{}, fmt.Errorf("parse trtllm metrics: %w", malformed("json", err))
	}
	var miss missing
	count := func(dst *Value, p *float64) {
		if p == nil || !finite(*p) {
			miss.add("%s", dst.Metric)
			return
		}
		dst.V, dst.Present = max(*p, 0), true
	}
	count(&m.Running, it.NumActiveRequests)
	count(&m.QueueLen, it.NumQueuedRequests)
	switch kv := it.KVCacheStats; {
	case kv == nil || kv.UsedNumBlocks == nil || kv.MaxNumBlocks == nil:
		miss.add("%s", TRTLLMKVCacheUsedBlocks)
	case !finite(*kv.UsedNumBlocks) || !finite(*kv.MaxNumBlocks) || *kv.MaxNumBlocks <= 0:
		miss.add("%s (not a usable fraction)", TRTLLMKVCacheUsedBlocks)
	default:
		m.KVUsage.V, m.KVUsage.Present = clamp01(*kv.UsedNumBlocks / *kv.MaxNumBlocks), true
	}
	if err := miss.err(); err != nil {
		return m, fmt.Errorf("parse trtllm metrics: %w", err)
	}
	return m, nil
}
