package vsim

import (
	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// prefixIndex returns the router's prefix index for a run, or nil when no
// item carries prefix hashes. It remembers, per worker, as many blocks as
// the largest worker's KV cache holds in the load's smallest block size
// (one capacity for every worker, as the router has).
func prefixIndex(workers []sim.WorkerSpec, items []bench.Item, clock *vclock) scheduler.PrefixIndex {
	block := 0
	for _, it := range items {
		if len(it.Prefix) > 0 && it.PrefixBlockTokens > 0 && (block == 0 || it.PrefixBlockTokens < block) {
			block = it.PrefixBlockTokens
		}
	}
	if block == 0 {
		return nil
	}
	kv := 0
	for _, w := range workers {
		kv = max(kv, w.Params.KVTokens)
	}
	return prefix.NewIndex(prefix.Options{Capacity: max(kv/block, 1), Now: clock.Now})
}
