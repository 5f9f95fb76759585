// Package serial makes calls in order per key, outside the caller's
// locks: Push queues a call without blocking, and one goroutine per key
// with calls pending makes them one after another (started when a call
// is queued, gone when none is left). The scheduler makes its shared
// ledger's network calls so: in order per model, a slow one delaying
// only the calls of its model.
package serial

import "sync"

// Runner makes calls in order per key. The zero value is ready to use.
// Its mutex guards only its queues, and is never held while a call runs.
type Runner struct {
	mu   sync.Mutex
	byK  map[string][]func() // calls not yet made, per key
	busy map[string]bool     // a goroutine is making the key's calls
	// idle is signalled, under mu, when the last key's goroutine ends:
	// Wait blocks on it while busy is not empty. (A WaitGroup cannot
	// serve: a Push from another goroutine may start a key's goroutine
	// while Wait waits, an Add from zero during a Wait.)
	idle *sync.Cond
}

// Push queues call for key, starting the key's goroutine if none runs.
// It never blocks on a call: it may be called under the caller's lock,
// and from a call.
func (r *Runner) Push(key string, call func()) {
	r.mu.Lock()
	if r.byK == nil {
		r.byK, r.busy = map[string][]func(){}, map[string]bool{}
		r.idle = sync.NewCond(&r.mu)
	}
	r.byK[key] = append(r.byK[key], call)
	start := !r.busy[key]
	r.busy[key] = true
	r.mu.Unlock()
	if start {
		go r.run(key)
	}
}

// run makes key's calls until none is left.
func (r *Runner) run(key string) {
	for {
		r.mu.Lock()
		q := r.byK[key]
		if len(q) == 0 {
			delete(r.byK, key)
			delete(r.busy, key)
			if len(r.busy) == 0 {
				r.idle.Broadcast()
			}
			r.mu.Unlock()
			return
		}
		call := q[0]
		q[0] = nil
		r.byK[key] = q[1:]
		r.mu.Unlock()
		call()
	}
}

// Wait returns when every call pushed so far has been made, and every
// call those calls pushed: when no key has calls in progress.
func (r *Runner) Wait() {
	r.mu.Lock()
	for len(r.busy) > 0 {
		r.idle.Wait()
	}
	r.mu.Unlock()
}
