package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sync"
)

// BlockKeys returns the index's chained keys of tokens' full blocks of
// blockSize: key i covers blocks 0..i (see the package doc). A partial
// last block has no key: vLLM caches full blocks only.
func BlockKeys(tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	var parent uint64
	for i := range n {
		parent = ChainKey(parent, tokens[i*blockSize:(i+1)*blockSize])
		out[i] = parent
	}
	return out
}

// ChainKey is the key of the block of tokens block whose parent block's
// key is parent (0 for a first block): FNV-1a over the parent's key and
// the block's tokens. It is BlockKeys one block at a time, for callers
// that remember keys of prefixes they have already cut.
func ChainKey(parent uint64, block []uint32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	buf := make([]byte, 4*len(block))
	for i, t := range block {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	h.Write(buf)
	return h.Sum64()
}

// Index is the exact index of every subscribed worker's blocks. It is
// safe for concurrent use: subscribers apply batches, the scheduler
// reads matches under its own lock (a memory read, no network).
type Index struct {
	mu      sync.RWMutex
	workers map[string]*workerIndex
	changed chan struct{} // closed at the next Apply or Desync
}

type workerIndex struct {
	keys      map[uint64]struct{}
	byHash    map[Hash]uint64 // vLLM's hash of each held block to its key
	blockSize int
	seq       int64 // the last batch applied; -1 before any
	synced    bool  // every batch since the last clear (or the start) was applied
	gapAt     int64 // the first seq missed, when not synced
	orphans   int   // stored blocks whose parent was unknown (not indexed)
}

func newWorkerIndex() *workerIndex {
	return &workerIndex{keys: map[uint64]struct{}{}, byHash: map[Hash]uint64{}, seq: -1, synced: true}
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{workers: map[string]*workerIndex{}, changed: make(chan struct{})}
}

// notifyLocked wakes the waiters of Wait.
func (x *Index) notifyLocked() {
	close(x.changed)
	x.changed = make(chan struct{})
}

// Wait blocks until cond holds of worker's stats (checked at every change)
// or ctx ends.
func (x *Index) Wait(ctx context.Context, worker string, cond func(Stats) bool) error {
	for {
		x.mu.RLock()
		ch := x.changed
		st, _ := x.statsLocked(worker)
		x.mu.RUnlock()
		if cond(st) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kvevents: %s: %w (at %+v)", worker, ctx.Err(), st)
		}
	}
}

func (x *Index) workerLocked(w string) *workerIndex {
	wi := x.workers[w]
	if wi == nil {
		wi = newWorkerIndex()
		x.workers[w] = wi
	}
	return wi
}

// Apply applies one batch of worker's events. A batch whose seq is not
// the next one is the caller's to repair first (Subscriber); Apply
// applies what it is given and notes its seq.
func (x *Index) Apply(worker string, b Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	wi := x.workerLocked(worker)
	for _, e := range b.Events {
		switch e.Kind {
		case KindCleared:
			clear(wi.keys)
			clear(wi.byHash)
			wi.synced, wi.gapAt = true, 0 // empty now: exact again
		case KindRemoved:
			for _, h := range e.BlockHashes {
				if k, ok := wi.byHash[h]; ok {
					delete(wi.keys, k)
					delete(wi.byHash, h)
				}
			}
		case KindStored:
			var parent uint64
			if e.Parent != "" {
				k, ok := wi.byHash[e.Parent]
				if !ok {
					wi.orphans += len(e.BlockHashes)
					continue // its tokens' prefix is unknown: no key
				}
				parent = k
			}
			wi.blockSize = e.BlockSize
			for i, h := range e.BlockHashes {
				parent = ChainKey(parent, e.TokenIDs[i*e.BlockSize:(i+1)*e.BlockSize])
				wi.keys[parent] = struct{}{}
				wi.byHash[h] = parent
			}
		}
	}
	wi.seq = b.Seq
	x.notifyLocked()
}

// Desync marks worker's index out of sync from seq on: batches from seq
// were lost and could not be replayed.
func (x *Index) Desync(worker string, seq int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	wi := x.workerLocked(worker)
	if wi.synced {
		wi.synced, wi.gapAt = false, seq
	}
	x.notifyLocked()
}

// Reset empties worker's index, as if it had had no events yet: its
// publisher's next batch starts it again.
func (x *Index) Reset(worker string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.workers[worker] = newWorkerIndex()
	x.notifyLocked()
}

// Forget drops worker's index.
func (x *Index) Forget(worker string) {
	x.mu.Lock()
	delete(x.workers, worker)
	x.mu.Unlock()
}

// Match returns how many of keys, from the first, worker holds, and the
// seq of the last batch applied. ok is false when the index cannot say:
// no events of the worker yet, or out of sync since a gap (why says so).
func (x *Index) Match(worker string, keys []uint64) (n int, seq int64, ok bool, why string) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	wi := x.workers[worker]
	switch {
	case wi == nil || wi.seq < 0:
		return 0, -1, false, "no KV events yet"
	case !wi.synced:
		return 0, wi.seq, false, fmt.Sprintf("KV events lost from seq %d", wi.gapAt)
	}
	for _, k := range keys {
		if _, held := wi.keys[k]; !held {
			break
		}
		n++
	}
	return n, wi.seq, true, ""
}

// Stats is what the index holds of one worker, for /api/workers.
type Stats struct {
	Blocks    int   `json:"blocks"`
	BlockSize int   `json:"block_size,omitempty"`
	Seq       int64 `json:"seq"`
	Synced    bool  `json:"synced"`
	GapAt     int64 `json:"gap_at,omitempty"`
	Orphans   int   `json:"orphans,omitempty"`
}

// Stats returns worker's, and whether it has any.
func (x *Index) Stats(worker string) (Stats, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.statsLocked(worker)
}

func (x *Index) statsLocked(worker string) (Stats, bool) {
	wi := x.workers[worker]
	if wi == nil {
		return Stats{Seq: -1}, false
	}
	return Stats{Blocks: len(wi.keys), BlockSize: wi.blockSize, Seq: wi.seq, Synced: wi.synced, GapAt: wi.gapAt, Orphans: wi.orphans}, true
}
