package sim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
)

// kvKeys are the router's index keys of a prompt of prefix blocks, from
// the simulator's stand-in token ids.
func kvKeys(prefix []uint64, bt int) []uint64 {
	return kvevents.BlockKeys(PromptTokenIDs(prefix, bt, len(prefix)*bt), bt)
}

// The events of a simulated prefix cache, applied to the router's exact
// index, make the index hold what the cache holds: after every request of
// a random load that keeps evicting (a cache of 24 blocks for prompts of
// up to 12), for every conversation's prefix, the index matches as many
// leading blocks as the cache does — and the cache behaves as it does
// without events. AllBlocksCleared empties both.
func TestEngine_CacheEventsKeepTheIndexExact(t *testing.T) {
	const bt = 16
	p := testParams()
	p.KVTokens = 24 * bt
	quiet, loud := NewEngine(p, t0), NewEngine(p, t0)
	x := kvevents.NewIndex()
	var seq int64
	var batches int
	loud.OnCacheEvents(func(_ time.Time, evs []kvevents.Event) {
		batches++
		x.Apply("w", kvevents.Batch{Seq: seq, Events: evs})
		seq++
	})
	rng := rand.New(rand.NewPCG(7, 7))
	// Conversations: chained hashes, each turn extending the last.
	convs := make([][]uint64, 6)
	for i := range convs {
		convs[i] = []uint64{uint64(1000 * (i + 1))}
	}
	now := t0
	for n := range 300 {
		c := rng.IntN(len(convs))
		if len(convs[c]) < 12 {
			convs[c] = append(convs[c], convs[c][len(convs[c])-1]*31+uint64(n))
		}
		pre := slices.Clone(convs[c][:1+rng.IntN(len(convs[c]))])
		r := Request{PromptTokens: len(pre)*bt + 3, MaxTokens: 2, IgnoreEOS: true, Prefix: pre, PrefixBlockTokens: bt}
		a, b := runOne(t, quiet, now, r), runOne(t, loud, now, r)
		if a != b {
			t.Fatalf("request %d: with events %+v, without %+v: reporting changed the engine", n, b, a)
		}
		now = b.Finished
		for ci, conv := range convs {
			want := loud.prefix.match(conv)
			got, _, ok, why := x.Match("w", kvKeys(conv, bt))
			if !ok || got != want {
				t.Fatalf("after request %d, conversation %d: index matches %d blocks (ok %v %s), cache %d", n, ci, got, ok, why, want)
			}
		}
	}
	if st, _ := x.Stats("w"); st.Blocks != loud.prefix.ll.Len() || st.Orphans != 0 || batches == 0 {
		t.Fatalf("index holds %d blocks (%d orphans) after %d batches, cache %d", st.Blocks, st.Orphans, batches, loud.prefix.ll.Len())
	}
	loud.ResetPrefixCache(now)
	if st, _ := x.Stats("w"); st.Blocks != 0 || loud.prefix.match(convs[0]) != 0 {
		t.Fatalf("after a reset the index holds %d blocks, the cache matches %d", st.Blocks, loud.prefix.match(convs[0]))
	}
}

// The stand-in tokenizer: equal hashes give equal ids, different ones
// different ids, and a prompt's ids are its blocks' then its tail's.
func TestPromptTokenIDs(t *testing.T) {
	a := PromptTokenIDs([]uint64{1, 2}, 4, 10)
	if len(a) != 10 || !slices.Equal(a[:4], BlockTokenIDs(nil, 1, 4)) || !slices.Equal(a[4:8], BlockTokenIDs(nil, 2, 4)) {
		t.Fatalf("ids %v", a)
	}
	if slices.Equal(BlockTokenIDs(nil, 1, 8), BlockTokenIDs(nil, 2, 8)) {
		t.Fatal("two blocks' ids are equal")
	}
	for _, id := range a {
		if id >= simVocab {
			t.Fatalf("id %d outside the vocabulary", id)
		}
	}
}
