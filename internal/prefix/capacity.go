package prefix

// SetCapacity bounds what x remembers of worker, for every model, to what a
// KV cache of tokens tokens holds: tokens/BlockTokens router blocks (at
// least one), instead of Options.Capacity. The worker reports its cache
// size (vLLM's num_gpu_blocks × block_size, llama.cpp's n_ctx) and the
// scheduler passes it on (scheduler.PrefixCapacity), so a worker with a
// large cache is not forgotten early and one with a small cache is not
// believed to hold more than it can. Options.WorkerCapacity, when it
// names the worker, wins: it is the operator's word. Blocks beyond a
// smaller bound are forgotten at once, least recent first; tokens <= 0
// changes nothing.
func (x *Index) SetCapacity(worker string, tokens int) {
	if tokens <= 0 {
		return
	}
	n := max(tokens/BlockTokens, 1)
	x.mu.Lock()
	defer x.mu.Unlock()
	if c, ok := x.perWorker[worker]; ok && c > 0 {
		return
	}
	if x.reported == nil {
		x.reported = map[string]int{}
	}
	x.reported[worker] = n
	x.resizeLocked(worker)
}

// resizeLocked applies worker's capacity to what is remembered of it, for
// every model.
func (x *Index) resizeLocked(worker string) {
	n := x.capacityOf(worker)
	for _, byWorker := range x.caches {
		if c := byWorker[worker]; c != nil {
			c.resize(n)
		}
	}
}

// Correct tells x what worker reported finding cached of a request for
// model whose prompt blocks are hashes (the worker served it): expected
// is how many of the leading blocks x's owner believed the worker held
// when it chose it, found how many it found (the answer's cached_tokens,
// timings.cache_n, in blocks).
//
// The index is a guess of the engine's cache: an LRU the size of the
// worker's KV cache. The engine's own LRU drifts from it: the engine
// stores a prompt once it has prefilled it, not when the router sends it;
// running sequences take room from old prefixes; the engine may not be
// the only client. The reports measure the drift, and the rule follows
// it in the simplest way that corrects itself:
//
//   - Fewer found than expected: the blocks believed beyond the found
//     ones were evicted and, the engine evicting least recent first, so
//     were the blocks believed older still. The capacity remembered of
//     the worker shrinks by the blocks missed, forgetting as many of the
//     oldest: the index now assumes a cache that holds less.
//   - As many or more found than expected: the capacity grows back, by
//     the blocks found beyond the guess (it had forgotten blocks the
//     worker still held), and by one when the guess was right, so that a
//     passing shortfall (a restarted engine, a burst of other traffic)
//     does not shrink the guess for good.
//
// The capacity stays between the request's own blocks and the worker's
// KV size (SetCapacity, Options). The blocks beyond the found ones were
// gone when the request came, but it has been prefilled since, so they
// are held: after a shortfall they are recorded again, as the most
// recent.
func (x *Index) Correct(model, worker string, hashes []uint64, expected, found int) {
	if len(hashes) == 0 || expected == 0 && found == 0 {
		return
	}
	step := found - expected
	if step == 0 {
		step = 1
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	size, held := x.sizeOf(worker), x.capacityOf(worker)
	switch n := min(max(held+step, min(len(hashes), size)), size); {
	case n == held:
	case n == size:
		delete(x.learned, worker)
		x.resizeLocked(worker)
	default:
		if x.learned == nil {
			x.learned = map[string]int{}
		}
		x.learned[worker] = n
		x.resizeLocked(worker)
	}
	if found < expected {
		x.recordLocked(model, hashes, worker, x.now(), false)
	}
}

// resize sets the lru's capacity, forgetting the least recent blocks
// beyond it.
func (c *lru) resize(capacity int) {
	c.capacity = capacity
	for len(c.pos) > capacity {
		c.dropTail()
	}
}

// dropTail forgets the least recent block and keeps the slab dense by
// moving its last node into the hole, when the capacity shrinks.
func (c *lru) dropTail() {
	i := c.tail
	c.unlink(i)
	delete(c.pos, c.nodes[i].hash)
	last := int32(len(c.nodes) - 1)
	if i != last {
		c.nodes[i] = c.nodes[last]
		c.pos[c.nodes[i].hash] = i
		if p := c.nodes[i].prev; p >= 0 {
			c.nodes[p].next = i
		} else {
			c.head = i
		}
		if n := c.nodes[i].next; n >= 0 {
			c.nodes[n].prev = i
		} else {
			c.tail = i
		}
	}
	c.nodes = c.nodes[:last]
}
