package proxy

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// errDrained is the cause an attempt's context is cancelled with when its
// worker's drain deadline passed: the relay continues the stream on
// another worker, and the worker is not blamed.
var errDrained = errors.New("the worker's drain deadline passed")

// liveStreams are the continuable streams in flight, by worker, in the
// order they registered: each registers the cancel hook of its attempt,
// so that a drain deadline can tell its relay to continue elsewhere. A
// stream that cannot be continued from the start registers nothing and
// finishes on its own; one that can no longer be (a tool call began, its
// continuations are used up) stays registered but is passed over
// (contStream.movable).
type liveStreams struct {
	mu sync.Mutex
	by map[string][]*liveStream
}

// liveStream is one registered attempt.
type liveStream struct {
	cs     *contStream
	cancel context.CancelCauseFunc
}

// add registers the attempt of cs on worker, cancelled by cancel; the
// returned func unregisters it.
func (l *liveStreams) add(worker string, cs *contStream, cancel context.CancelCauseFunc) (remove func()) {
	s := &liveStream{cs: cs, cancel: cancel}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string][]*liveStream{}
	}
	l.by[worker] = append(l.by[worker], s)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		rest := slices.DeleteFunc(l.by[worker], func(o *liveStream) bool { return o == s })
		if len(rest) == 0 {
			delete(l.by, worker)
		} else {
			l.by[worker] = rest
		}
	}
}

// move tells each stream on worker that can still go on elsewhere to
// continue there (reason "drain"), in the order they registered, and
// returns how many it told. The others are left to finish where they
// are: cutting them would only end them with an error event.
func (l *liveStreams) move(worker string) int {
	l.mu.Lock()
	streams := slices.Clone(l.by[worker])
	l.mu.Unlock()
	n := 0
	for _, s := range streams {
		if s.cs.movable() {
			s.cancel(errDrained)
			n++
		}
	}
	return n
}

// DrainAfter moves the continuable streams relayed from a draining
// worker elsewhere when at fires, including streams bound to it just
// before it began draining, which register only once their request is
// sent. A worker of the same name added later is another worker: adding
// it stops the drain first, so this never moves its streams. stop
// cancels it.
func (h *Handler) DrainAfter(worker string, at <-chan time.Time) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-at:
			n := h.live.move(worker)
			h.opt.Logger.Info("drain deadline passed: continuing the worker's streams elsewhere", "worker", worker, "streams", n)
		case <-done:
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}
