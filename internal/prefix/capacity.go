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
	for _, byWorker := range x.caches {
		if c := byWorker[worker]; c != nil {
			c.resize(n)
		}
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
// moving its last node into the hole; expire and capacity eviction both
// drop this way.
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
