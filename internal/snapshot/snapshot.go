// Package snapshot is what the scheduler knows of a worker from outside
// Sluice: its health, models and telemetry readings, each with where and
// when it was read. The fleet publishes a worker's Snapshot and the
// scheduler reads it on every pick.
package snapshot

import (
	"time"

	"github.com/sluice-router/sluice/internal/lora"
)

// Health is a worker's health as the fleet last judged it.
type Health int

const (
	// HealthUnknown means no probe has answered yet. Such a worker is
	// eligible, so a new worker takes traffic before its first probe.
	HealthUnknown Health = iota
	// HealthOK means the worker answered its health probe and is serving.
	HealthOK
	// HealthLoading means the worker is up but still loading its model.
	HealthLoading
	// HealthDown means the worker failed enough probes or requests in a row
	// to be ejected.
	HealthDown
)

// String returns the health as a lower-case word for records and APIs.
func (h Health) String() string {
	switch h {
	case HealthOK:
		return "ok"
	case HealthLoading:
		return "loading"
	case HealthDown:
		return "down"
	default:
		return "unknown"
	}
}

// MarshalText makes Health appear as its word in JSON.
func (h Health) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// Reading is one telemetry value with its provenance: where it came from and
// when it was read, so a decision record can say how old every input was.
type Reading struct {
	// Value is the reading itself (a count, or a fraction in 0..1).
	Value float64 `json:"value"`
	// Source names where the value came from, e.g.
	// "llamacpp:/metrics llamacpp:kv_cache_usage_ratio"; empty when never
	// read.
	Source string `json:"source,omitempty"`
	// At is when the value was read; zero when never.
	At time.Time `json:"at,omitzero"`
}

// Known reports whether the reading came from somewhere.
func (r Reading) Known() bool { return !r.At.IsZero() }

// Snapshot is everything the scheduler knows of a worker from outside
// Sluice. It is immutable once published: the fleet replaces it
// wholesale, so the scheduler reads it without locks.
type Snapshot struct {
	// Health is the worker's current health.
	Health Health `json:"health"`
	// HealthReason says why, e.g. the last probe error.
	HealthReason string `json:"health_reason,omitempty"`
	// Models lists the models the worker has loaded. Nil means "unknown";
	// the scheduler then falls back to the models in the worker's config.
	Models []string `json:"models"`
	// LoadingModels lists the models the worker is loading now, when it
	// serves several and says so.
	LoadingModels []string `json:"loading_models,omitempty"`
	// Slots is the number of parallel slots the worker reports; 0 when
	// unknown. It caps the limit when max_concurrency is unset.
	Slots int `json:"slots,omitempty"`
	// ContextTokens is the longest request, prompt plus completion, the
	// worker can hold in one slot; 0 when unknown.
	ContextTokens int `json:"context_tokens,omitempty"`
	// QueueLen is the number of requests waiting inside the worker itself.
	QueueLen Reading `json:"queue_len"`
	// KVPressure is the fraction of the worker's KV cache in use, 0..1.
	KVPressure Reading `json:"kv_pressure"`
	// GPUUtil is the GPU's utilisation, 0..1.
	GPUUtil Reading `json:"gpu_util"`
	// KVCacheTokens is the capacity of the worker's KV cache in tokens;
	// 0 when unknown. It bounds the prefix index's memory of the worker.
	KVCacheTokens int `json:"kv_cache_tokens,omitempty"`
	// KVPoolTokens is the capacity in tokens of the one KV cache every
	// request on the worker draws from (vLLM, llama.cpp's unified cache,
	// the simulators); 0 when unknown or when each slot has its own. The
	// KV-fit rule reads it.
	KVPoolTokens int `json:"kv_pool_tokens,omitempty"`
	// PrefixHitRate is the fraction of prompt tokens the worker found in
	// its prefix cache between its last two scrapes; shown, not scored.
	PrefixHitRate Reading `json:"prefix_hit_rate,omitzero"`
	// CacheReport is what the worker says its KV cache holds; nil when
	// it does not say.
	CacheReport *CacheReport `json:"cache_report,omitempty"`
	// Adapters are the LoRA adapters the worker reports holding.
	Adapters []lora.Info `json:"adapters,omitempty"`
}

// Source publishes the latest Snapshot of one worker. Snapshot must not
// block: it is called on the routing hot path under the scheduler's lock.
type Source interface {
	Snapshot() *Snapshot
}

// CacheReport is a worker's own account of the prompt prefixes its KV
// cache holds (llama.cpp /slots): the chained block hashes of each slot's
// prompt text, computed with the proxy's block function. Immutable once
// published.
type CacheReport struct {
	// Source names the report, e.g. "llama.cpp /slots".
	Source string `json:"source"`
	// At is when the worker was asked.
	At time.Time `json:"at"`
	// Blocks holds the chained block hashes of every slot's prompt.
	Blocks map[uint64]struct{} `json:"-"`
	// NBlocks is len(Blocks), for /api/workers.
	NBlocks int `json:"blocks"`
	// Slots is the number of slots that reported a prompt.
	Slots int `json:"slots"`
}

// Match returns the fraction of hashes, counted from the first, that the
// report holds; 0 for no hashes or a nil report.
func (r *CacheReport) Match(hashes []uint64) float64 {
	if r == nil || len(hashes) == 0 {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := r.Blocks[h]; !ok {
			break
		}
		n++
	}
	return float64(n) / float64(len(hashes))
}
