package sim

import "container/list"

// prefixCache is a worker's prefix cache: the prompt blocks it has
// computed, by chained block hash (see Request.Prefix), least recently
// used first out, within KVTokens tokens.
//
// It models what vLLM's automatic prefix caching and llama.cpp's prompt
// cache give: a request whose leading blocks the worker holds prefills
// only the rest. It is a simplification in two ways: the cache's capacity
// is the whole KV cache, not what running sequences leave free (a busy
// card keeps fewer old prefixes), and the running sequences' own KV is
// counted as before, whether its blocks are shared or not.
type prefixCache struct {
	capacity int // tokens
	used     int
	ll       *list.List // of *cachedBlock, most recent first
	pos      map[uint64]*list.Element
	// log, when not nil, notes what each insert changed, for the KV-cache
	// events (kvevents.go); nil costs nothing.
	log *cacheLog
}

type cachedBlock struct {
	hash   uint64
	tokens int
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, ll: list.New(), pos: map[uint64]*list.Element{}}
}

// match returns how many of hashes, from the first, are cached.
func (c *prefixCache) match(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := c.pos[h]; !ok {
			break
		}
		n++
	}
	return n
}

// insert caches hashes, each block of blockTokens tokens, refreshing from
// the last to the first so the shared first blocks are evicted last.
func (c *prefixCache) insert(hashes []uint64, blockTokens int) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if e, ok := c.pos[h]; ok {
			c.ll.MoveToFront(e)
			continue
		}
		if blockTokens > c.capacity {
			return
		}
		for c.used+blockTokens > c.capacity {
			old := c.ll.Remove(c.ll.Back()).(*cachedBlock)
			delete(c.pos, old.hash)
			c.used -= old.tokens
			if c.log != nil {
				c.log.evicted(old.hash)
			}
		}
		c.pos[h] = c.ll.PushFront(&cachedBlock{hash: h, tokens: blockTokens})
		c.used += blockTokens
		if c.log != nil {
			c.log.stored(i, h)
		}
	}
}

// reset empties the cache.
func (c *prefixCache) reset() {
	c.ll.Init()
	clear(c.pos)
	c.used = 0
}

// cachedPrefill returns how many of the tokens s must prefill are already
// in the worker's prefix cache: the whole blocks of its prompt prefix found
// there, leaving at least one token to compute (the first output token
// needs a forward pass). It notes the count in s's result.
func (e *Engine) cachedPrefill(s *Seq) int {
	r := s.req
	if len(r.Prefix) == 0 || r.PrefixBlockTokens <= 0 {
		return 0
	}
	if e.prefix == nil {
		e.prefix = newPrefixCache(e.p.KVTokens)
	}
	hit := min(e.prefix.match(r.Prefix)*r.PrefixBlockTokens, r.PromptTokens, s.prefill-1)
	hit = max(hit, 0)
	s.res.CachedTokens = hit
	e.m.cachedTokens += int64(hit)
	return hit
}

// cachePrompt caches s's prompt blocks once its prefill has run.
func (e *Engine) cachePrompt(s *Seq) {
	r := s.req
	if len(r.Prefix) == 0 || r.PrefixBlockTokens <= 0 {
		return
	}
	if e.prefix == nil {
		e.prefix = newPrefixCache(e.p.KVTokens)
	}
	if e.onCache == nil {
		e.prefix.insert(r.Prefix, r.PrefixBlockTokens)
		return
	}
	e.prefix.log = &e.cacheLog
	e.cacheLog.begin()
	e.prefix.insert(r.Prefix, r.PrefixBlockTokens)
	e.prefix.log = nil
	e.publishInsert(r.Prefix, r.PrefixBlockTokens)
}

// PrefixHeld returns how many of hashes, counted from the first, the
// worker's prefix cache holds now: what a request with that prefix would
// find cached, in blocks. It changes nothing (no block is refreshed).
func (e *Engine) PrefixHeld(hashes []uint64) int {
	if e.prefix == nil {
		return 0
	}
	return e.prefix.match(hashes)
}
