package vsim

import (
	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// prefixIndex returns the router's prefix index for a run, or nil when no
// item carries prefix hashes. It remembers, per worker, as many blocks as
// the worker's KV cache holds in the load's smallest block size.
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
	per := make(map[string]int, len(workers))
	for _, w := range workers {
		per[w.Name] = max(w.Params.KVTokens/block, 1)
	}
	return prefix.NewIndex(prefix.Options{WorkerCapacity: per, Now: clock.Now})
}
