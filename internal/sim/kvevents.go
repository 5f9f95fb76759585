package sim

import (
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
)

// The simulator's KV-cache events: what its prefix cache stores, evicts
// and clears, as vLLM publishes them with --kv-events-config (see package
// kvevents), so that the router's exact index can follow a simulated
// worker as it follows a real one.
//
// # Token ids: the simulator's stand-in for a tokenizer
//
// vLLM's BlockStored carries each block's token ids, and the router keys
// its index by a chained hash of them (kvevents.BlockKeys). The simulator
// has no tokenizer: its blocks are the chained hashes of Request.Prefix
// (the router's text blocks, or a trace's hash_ids). So a block's token
// ids are derived from its chained hash — BlockTokenIDs, n ids from a
// generator seeded by the hash — and whoever stands in for the
// tokenizer on the request side (the simulated /tokenize, the virtual
// router of package vsim) derives a prompt's ids from the same hashes
// (PromptTokenIDs). Equal prefixes thus give equal token ids, different
// ones different ids, as a tokenizer would.

// simVocab is the size of the made-up vocabulary, Llama 3's.
const simVocab = 128256

// BlockTokenIDs appends to dst the n token ids of the block whose chained
// prefix hash is h: splitmix64 seeded by h, each output mod simVocab.
func BlockTokenIDs(dst []uint32, h uint64, n int) []uint32 {
	x := h ^ 0x5ee1_7e5e_7a11_0c0d
	for range n {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		dst = append(dst, uint32(z%simVocab))
	}
	return dst
}

// PromptTokenIDs returns a prompt's token ids as the simulator's stand-in
// tokenizer gives them: blockTokens ids for each of its prefix blocks,
// then ids for the tokens past them up to promptTokens (derived from the
// last block's hash, so the tail is not a block anybody holds).
func PromptTokenIDs(prefix []uint64, blockTokens, promptTokens int) []uint32 {
	out := make([]uint32, 0, max(promptTokens, len(prefix)*blockTokens))
	for _, h := range prefix {
		out = BlockTokenIDs(out, h, blockTokens)
	}
	if rest := promptTokens - len(out); rest > 0 {
		var last uint64
		if len(prefix) > 0 {
			last = prefix[len(prefix)-1]
		}
		out = BlockTokenIDs(out, ^last, rest)
	}
	return out
}

// KVHash is the block hash a simulated worker publishes for the block of
// chained prefix hash h (vLLM's ExternalBlockHash, an int).
func KVHash(h uint64) kvevents.Hash { return kvevents.IntHash(int64(h)) }

// OnCacheEvents makes the engine report every change of its prefix cache
// to f as KV-cache events, in order: a BlockStored per run of consecutive
// prompt blocks newly cached (parent first, so the parent's key is known
// when its child arrives), a BlockRemoved for the blocks evicted to make
// room, AllBlocksCleared at ResetPrefixCache. f runs synchronously inside
// the Engine call that made the change, with the time of the change, and
// must not call the engine. nil stops the reports. Reporting changes
// nothing of what the engine does.
func (e *Engine) OnCacheEvents(f func(at time.Time, events []kvevents.Event)) { e.onCache = f }

// ResetPrefixCache drops every cached prefix at now, as vLLM's POST
// /reset_prefix_cache does, and reports AllBlocksCleared.
func (e *Engine) ResetPrefixCache(now time.Time) {
	e.advance(now)
	if e.prefix != nil {
		e.prefix.reset()
	}
	if e.onCache != nil {
		e.onCache(e.now, []kvevents.Event{{Kind: kvevents.KindCleared}})
	}
	e.flush()
}

// cacheLog notes what one insert changed: the blocks evicted that were
// cached before it, and the prompt blocks it cached (by index) that are
// still cached at its end.
type cacheLog struct {
	removed []uint64
	fresh   map[uint64]int // hash -> index in the prompt
	idx     []int
}

func (l *cacheLog) begin() {
	l.removed = l.removed[:0]
	if l.fresh == nil {
		l.fresh = map[uint64]int{}
	}
	clear(l.fresh)
}

// evicted notes the eviction of h; a block cached by this same insert
// and evicted again is no change at all.
func (l *cacheLog) evicted(h uint64) {
	if _, ok := l.fresh[h]; ok {
		delete(l.fresh, h)
		return
	}
	l.removed = append(l.removed, h)
}

func (l *cacheLog) stored(i int, h uint64) { l.fresh[h] = i }

// publishInsert reports the last insert of hashes: the evictions first
// (a block evicted then cached again within the insert is removed, then
// stored), then the stored blocks in prompt order, one BlockStored per
// run of consecutive blocks, each naming the block before the run as its
// parent.
func (e *Engine) publishInsert(hashes []uint64, blockTokens int) {
	l := &e.cacheLog
	var evs []kvevents.Event
	if len(l.removed) > 0 {
		rm := make([]kvevents.Hash, len(l.removed))
		for i, h := range l.removed {
			rm[i] = KVHash(h)
		}
		evs = append(evs, kvevents.Event{Kind: kvevents.KindRemoved, BlockHashes: rm, Medium: "GPU"})
	}
	l.idx = l.idx[:0]
	for _, i := range l.fresh {
		l.idx = append(l.idx, i)
	}
	slices.Sort(l.idx)
	for a := 0; a < len(l.idx); {
		b := a
		for b+1 < len(l.idx) && l.idx[b+1] == l.idx[b]+1 {
			b++
		}
		from, to := l.idx[a], l.idx[b]
		ev := kvevents.Event{Kind: kvevents.KindStored, BlockSize: blockTokens, Medium: "GPU",
			TokenIDs: make([]uint32, 0, (to-from+1)*blockTokens)}
		if from > 0 {
			ev.Parent = KVHash(hashes[from-1])
		}
		for k := from; k <= to; k++ {
			ev.BlockHashes = append(ev.BlockHashes, KVHash(hashes[k]))
			ev.TokenIDs = BlockTokenIDs(ev.TokenIDs, hashes[k], blockTokens)
		}
		evs = append(evs, ev)
		a = b + 1
	}
	if len(evs) > 0 {
		e.onCache(e.now, evs)
	}
}
