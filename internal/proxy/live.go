package proxy

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
)

// errDrained is the cause an attempt's context is cancelled with when its
// worker's drain deadline passed: the relay continues the stream on
// another worker, and the worker is not blamed.
var errDrained = errors.New("the worker's drain deadline passed")

// liveStreams are the continuable streams in flight, by worker: each
// registers the cancel hook of its attempt, so that a drain deadline can
// tell its relay to continue elsewhere. A stream that cannot be continued
// from the start registers nothing and finishes on its own; one that can
// no longer be (a tool call began, its continuations are used up) stays
// registered but is passed over (contStream.movable).
type liveStreams struct {
	mu  sync.Mutex
	seq uint64
	by  map[string]map[*liveStream]struct{}
}

// liveStream is one registered attempt.
type liveStream struct {
	seq    uint64 // registration order
	cs     *contStream
	cancel context.CancelCauseFunc
}

// add registers the attempt of cs on worker, cancelled by cancel; the
// returned func unregisters it.
func (l *liveStreams) add(worker string, cs *contStream, cancel context.CancelCauseFunc) (remove func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string]map[*liveStream]struct{}{}
	}
	set := l.by[worker]
	if set == nil {
		set = map[*liveStream]struct{}{}
		l.by[worker] = set
	}
	l.seq++
	s := &liveStream{seq: l.seq, cs: cs, cancel: cancel}
	set[s] = struct{}{}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(set, s)
		if len(set) == 0 && l.by[worker] != nil && len(l.by[worker]) == 0 {
			delete(l.by, worker)
		}
	}
}

// snapshot returns the attempts registered for worker now, in the order
// they were registered.
func (l *liveStreams) snapshot(worker string) []*liveStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*liveStream
	for s := range l.by[worker] {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *liveStream) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// move tells each of streams that can still go on elsewhere to continue
// there (reason "drain"), in order, and returns how many it told. A
// stream that cannot (a tool call or reasoning began, its continuations
// are used up) is left to finish where it is: cutting it would only end
// it with an error event.
func move(streams []*liveStream) int {
	n := 0
	for _, s := range streams {
		if s.cs.movable() {
			s.cancel(errDrained)
			n++
		}
	}
	return n
}

// ContinueElsewhere tells every continuable stream now relayed from
// worker to continue on another worker (reason "drain"), and returns how
// many it told. It is what a drain deadline does: the worker stops being
// given work at once (the scheduler's draining), and at the deadline the
// streams it still writes move instead of being cut or waited for.
func (h *Handler) ContinueElsewhere(worker string) int {
	return move(h.live.snapshot(worker))
}

// DrainAfter arranges ContinueElsewhere(worker) when at is closed: the
// streams on the worker then, including those bound to it in the instant
// before it began draining, which register only once their request is
// sent. A worker of the same name added later is another worker: adding
// it stops the drain first (the server's stopDrain), so this never moves
// its streams. The returned stop cancels it, and reports whether it had
// not fired yet.
func (h *Handler) DrainAfter(worker string, at <-chan struct{}) (stop func() bool) {
	done := make(chan struct{})
	var once sync.Once
	fired := false
	var mu sync.Mutex
	go func() {
		select {
		case <-at:
			mu.Lock()
			fired = true
			mu.Unlock()
			move(h.live.snapshot(worker))
		case <-done:
		}
	}()
	return func() bool {
		once.Do(func() { close(done) })
		mu.Lock()
		defer mu.Unlock()
		return !fired
	}
}
