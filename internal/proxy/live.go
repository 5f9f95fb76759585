package proxy

import (
	"context"
	"errors"
	"sync"
)

// errDrained is the cause an attempt's context is cancelled with when its
// worker's drain deadline passed: the relay continues the stream on
// another worker, and the worker is not blamed.
var errDrained = errors.New("the worker's drain deadline passed")

// liveStreams are the continuable streams in flight, by worker: each
// registers the cancel hook of its attempt, so that a drain deadline can
// tell its relay to continue elsewhere. A stream that cannot be continued
// registers nothing and finishes on its own.
type liveStreams struct {
	mu sync.Mutex
	by map[string]map[*context.CancelCauseFunc]struct{}
}

// add registers cancel for worker; the returned func unregisters it.
func (l *liveStreams) add(worker string, cancel context.CancelCauseFunc) (remove func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string]map[*context.CancelCauseFunc]struct{}{}
	}
	set := l.by[worker]
	if set == nil {
		set = map[*context.CancelCauseFunc]struct{}{}
		l.by[worker] = set
	}
	key := &cancel
	set[key] = struct{}{}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(set, key)
		if len(set) == 0 && l.by[worker] != nil && len(l.by[worker]) == 0 {
			delete(l.by, worker)
		}
	}
}

// snapshot returns the hooks registered for worker now.
func (l *liveStreams) snapshot(worker string) []context.CancelCauseFunc {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []context.CancelCauseFunc
	for k := range l.by[worker] {
		out = append(out, *k)
	}
	return out
}

// ContinueElsewhere tells every continuable stream now relayed from
// worker to continue on another worker (reason "drain"), and returns how
// many it told. It is what a drain deadline does: the worker stops being
// given work at once (the scheduler's draining), and at the deadline the
// streams it still writes move instead of being cut or waited for.
func (h *Handler) ContinueElsewhere(worker string) int {
	hooks := h.live.snapshot(worker)
	for _, cancel := range hooks {
		cancel(errDrained)
	}
	return len(hooks)
}

// DrainAfter arranges ContinueElsewhere(worker) after the deadline, for
// the streams on the worker now (a worker of the same name added later is
// another worker). after is time.After unless a test steers it. The
// returned stop cancels it, and reports whether it had not fired yet.
func (h *Handler) DrainAfter(worker string, at <-chan struct{}) (stop func() bool) {
	hooks := h.live.snapshot(worker)
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
			for _, cancel := range hooks {
				cancel(errDrained)
			}
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
