package vsim

import (
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/sim"
)

// The exact index of KV-cache events in virtual time (Config.KVEvents).
//
// Each engine reports its prefix cache's changes (sim.Engine.
// OnCacheEvents) and the loop applies them at once to one kvevents.Index,
// the type the router's subscribers fill from ZeroMQ: no sockets, no
// loss, no lag, so the index holds what every cache holds at every
// instant. A request's KVBlocks are cut from the token ids the
// simulator's stand-in tokenizer gives its prefix blocks
// (sim.PromptTokenIDs), as the router cuts a real worker's /tokenize
// answer, so a match is a match on the ids the engines published.

// kvState is a run's exact index and what it takes to key requests.
type kvState struct {
	index *kvevents.Index
	// keys memoises a block's key by (parent key, prefix hash): requests
	// share their leading blocks, and a key costs a block of token ids.
	keys map[[2]uint64]uint64
	ids  []uint32 // scratch
}

// newKVState feeds every engine's cache events into a fresh index.
func newKVState(workers []*vworker) *kvState {
	kv := &kvState{index: kvevents.NewIndex(), keys: map[[2]uint64]uint64{}}
	for _, vw := range workers {
		var seq int64
		vw.eng.OnCacheEvents(func(at time.Time, evs []kvevents.Event) {
			kv.index.Apply(vw.name, kvevents.Batch{Seq: seq, TS: float64(at.UnixNano()) / 1e9, Events: evs})
			seq++
		})
	}
	return kv
}

// blocks returns the keys of a prompt's prefix blocks of bt tokens.
func (kv *kvState) blocks(prefix []uint64, bt int) []uint64 {
	if len(prefix) == 0 || bt <= 0 {
		return nil
	}
	out := make([]uint64, len(prefix))
	var parent uint64
	for i, h := range prefix {
		k, ok := kv.keys[[2]uint64{parent, h}]
		if !ok {
			kv.ids = sim.BlockTokenIDs(kv.ids[:0], h, bt)
			k = kvevents.ChainKey(parent, kv.ids)
			kv.keys[[2]uint64{parent, h}] = k
		}
		out[i], parent = k, k
	}
	return out
}

// expect is what the index says worker holds of a request's blocks, in
// prompt tokens, with the engine's own cap on a hit (the whole prompt but
// one token) applied; 0 when the index cannot say.
func (kv *kvState) expect(worker string, keys []uint64, bt, prompt int) int64 {
	n, _, ok, _ := kv.index.Match(worker, keys)
	if !ok {
		return 0
	}
	return int64(max(min(n*bt, prompt-1), 0))
}
