package prefix

import (
	"sync"
	"time"
)

const (
	// DefaultCapacity is the blocks remembered per worker and model: 256
	// router blocks are about 32,768 tokens, the KV cache of a
	// llama-server started with -c 32768 (and of the simulated workers).
	DefaultCapacity = 256
)

// Options configure an Index; zero values take the defaults.
type Options struct {
	// Capacity bounds the blocks remembered per worker and model; the
	// least recently recorded are forgotten first.
	Capacity int
	// WorkerCapacity overrides Capacity per worker name: a worker with a
	// smaller KV cache keeps fewer blocks.
	WorkerCapacity map[string]int
	// Now tells the time; time.Now when nil. Tests and the virtual-time
	// simulation inject their clock.
	Now func() time.Time
}

// Index remembers which worker recently served which block hashes, per
// model, within bounded memory: at most Capacity blocks per worker and
// model, the least recent forgotten first, as an engine's prefix cache
// evicts. Nothing is forgotten by age: an engine keeps a block until it
// needs the room, however old, and what the workers report finding
// corrects the size the index assumes (Correct). It is safe for
// concurrent use (one mutex; every call is short and calls nothing
// outside).
type Index struct {
	capacity  int
	perWorker map[string]int
	now       func() time.Time

	mu sync.Mutex
	// caches are the blocks remembered, by model, then worker: a pick
	// asks about every worker of one model, so the model is looked up
	// once and each worker by its name alone.
	caches   map[string]map[string]*lru
	reported map[string]int // per-worker capacity from SetCapacity
	learned  map[string]int // per-worker capacity corrected by Correct
}

// NewIndex returns an empty Index.
func NewIndex(o Options) *Index {
	if o.Capacity <= 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Index{capacity: o.Capacity, perWorker: o.WorkerCapacity, now: o.Now, caches: map[string]map[string]*lru{}}
}

// MatchSources sets frac[i] (both of len(workers)) to the fraction of
// hashes, counted from the first, that workers[i] is expected to hold for
// model: the longest run of leading blocks it recently served, over
// len(hashes); 0 for no hashes. remote[i] tells whether any of the matched
// blocks was last recorded by another replica (through Apply) rather than
// by this router's own Record. It answers for every worker under one lock
// (a pick asks about every candidate), and refreshes nothing.
func (x *Index) MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool) {
	if len(hashes) == 0 {
		clear(frac[:len(workers)])
		clear(remote[:len(workers)])
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	byWorker := x.caches[model]
	for i, w := range workers {
		frac[i], remote[i] = matchIn(byWorker[w], hashes)
	}
}

// matchIn is one worker's answer of MatchSources in c, its cache of the
// model (nil when none), hashes not empty.
func matchIn(c *lru, hashes []uint64) (frac float64, remote bool) {
	if c == nil {
		return 0, false
	}
	n := 0
	for _, h := range hashes {
		i, ok := c.pos[h]
		if !ok {
			break
		}
		remote = remote || c.nodes[i].remote
		n++
	}
	return float64(n) / float64(len(hashes)), remote
}

// Record notes that worker is serving hashes for model. The blocks are
// refreshed from the last to the first, so that the first blocks, shared
// by the most prompts, are the last to be forgotten.
func (x *Index) Record(model string, hashes []uint64, worker string) {
	if len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.recordLocked(model, hashes, worker, x.now(), false)
}

// Apply notes, as Record does, that worker served hashes for model at
// time at, as another replica reports it: a block keeps the later of its
// own time and at, and a block whose time is at is marked as recorded
// elsewhere (see MatchSources). A report from the future (clock skew)
// counts as now. The bounds are those of Record.
func (x *Index) Apply(model string, hashes []uint64, worker string, at time.Time) {
	if len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	now := x.now()
	if at.After(now) {
		at = now
	}
	x.recordLocked(model, hashes, worker, at, true)
}

func (x *Index) recordLocked(model string, hashes []uint64, worker string, at time.Time, remote bool) {
	byWorker := x.caches[model]
	if byWorker == nil {
		byWorker = map[string]*lru{}
		x.caches[model] = byWorker
	}
	c := byWorker[worker]
	if c == nil {
		c = newLRU(x.capacityOf(worker))
		byWorker[worker] = c
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		c.touch(hashes[i], at, remote)
	}
}

// Capacity returns the blocks remembered per model for worker: at most
// this many of a Record's hashes, the first, can be remembered.
func (x *Index) Capacity(worker string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.capacityOf(worker)
}

// capacityOf is the blocks remembered of worker: its cache's size, or
// less when what it reported finding says it holds less (Correct).
func (x *Index) capacityOf(worker string) int {
	size := x.sizeOf(worker)
	if n, ok := x.learned[worker]; ok {
		return min(n, size)
	}
	return size
}

// sizeOf is the blocks worker's KV cache holds: the operator's word, else
// the worker's report, else Options.Capacity.
func (x *Index) sizeOf(worker string) int {
	if n, ok := x.perWorker[worker]; ok && n > 0 {
		return n
	}
	if n, ok := x.reported[worker]; ok {
		return n
	}
	return x.capacity
}

// Forget drops everything remembered of worker (it was removed).
func (x *Index) Forget(worker string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.reported, worker)
	delete(x.learned, worker)
	for model, byWorker := range x.caches {
		delete(byWorker, worker)
		if len(byWorker) == 0 {
			delete(x.caches, model)
		}
	}
}

// Len returns the blocks remembered of worker for model.
func (x *Index) Len(model, worker string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if c := x.caches[model][worker]; c != nil {
		return len(c.pos)
	}
	return 0
}

// lru is a bounded set of block hashes in recency order, on a slab of
// nodes linked by index, so it allocates only when it grows.
type lru struct {
	capacity   int
	pos        map[uint64]int32
	nodes      []node
	head, tail int32 // most and least recent; -1 when empty
}

type node struct {
	hash       uint64
	at         time.Time
	prev, next int32
	remote     bool // at came from another replica (Apply)
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, pos: make(map[uint64]int32), head: -1, tail: -1}
}

// touch makes h the most recent block, adding it (and forgetting the
// least recent when full) if it is new. A block already there keeps the
// later of its time and at (a replica's report may arrive after this
// router's own, newer record); remote tells whether at came from another
// replica.
func (c *lru) touch(h uint64, at time.Time, remote bool) {
	if i, ok := c.pos[h]; ok {
		if n := &c.nodes[i]; !at.Before(n.at) {
			n.at, n.remote = at, remote
		}
		c.unlink(i)
		c.pushFront(i)
		return
	}
	var i int32
	if len(c.nodes) < c.capacity {
		c.nodes = append(c.nodes, node{})
		i = int32(len(c.nodes) - 1)
	} else {
		i = c.tail // reuse the least recent node
		c.unlink(i)
		delete(c.pos, c.nodes[i].hash)
	}
	c.nodes[i] = node{hash: h, at: at, prev: -1, next: -1, remote: remote}
	c.pos[h] = i
	c.pushFront(i)
}

func (c *lru) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (c *lru) pushFront(i int32) {
	c.nodes[i].prev, c.nodes[i].next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}
