package scheduler

// The exact index of KV-cache events (Config.KVIndex) learns a prompt's
// blocks only once the worker has prefilled it and published them, so a
// conversation's next turn, or a burst of requests sharing a long
// document, sent before those events arrive would look uncached
// everywhere and scatter. The scheduler therefore also remembers the
// blocks of the requests it has sent to each worker and that are still in
// flight: a prompt that shares a prefix with one of them is expected
// there too. An entry is dropped when its request ends, by which time the
// worker's own events for it have long been applied.

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
// requests sent to a worker and in flight there shares: the blocks the
// worker is expected to hold once it has prefilled them.
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
