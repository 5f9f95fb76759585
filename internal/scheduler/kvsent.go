package scheduler

// KV-cache events tell the index of a prompt's blocks only once the
// worker has prefilled them, so a next turn sent before then would look
// uncached everywhere. The scheduler therefore remembers the blocks of
// the requests in flight on each worker, until each ends.

// kvSent is one in-flight request's prompt blocks on a worker.
type kvSent struct {
	l    *Lease
	keys []uint64
}

// kvSendLocked remembers l's prompt blocks on its worker.
func (s *Scheduler) kvSendLocked(l *Lease) {
	if s.cfg.KVIndex == nil || len(l.req.KVBlocks) == 0 {
		return
	}
	l.w.kvSent = append(l.w.kvSent, kvSent{l: l, keys: l.req.KVBlocks})
}

// kvDoneLocked forgets l's prompt blocks.
func (s *Scheduler) kvDoneLocked(l *Lease) {
	sent := l.w.kvSent
	for i := range sent {
		if sent[i].l == l {
			last := len(sent) - 1
			sent[i] = sent[last]
			sent[last] = kvSent{}
			l.w.kvSent = sent[:last]
			return
		}
	}
}

// kvSentMatch returns how many of keys, from the first, one of the
// requests in flight on a worker shares.
func kvSentMatch(sent []kvSent, keys []uint64) int {
	best := 0
	for _, e := range sent {
		n := 0
		for n < len(keys) && n < len(e.keys) && keys[n] == e.keys[n] {
			n++
		}
		best = max(best, n)
	}
	return best
}
