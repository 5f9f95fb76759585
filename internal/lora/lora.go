// Package lora keeps what Sluice knows of the LoRA adapters on one worker
// beyond its telemetry: the loads it makes there and the adapters it
// loaded. The scheduler owns one Holdings per worker and updates it under
// its lock; a Load is made outside the lock, by the first request bound to
// it that gets ready (it takes the turn), and waited for by the others.
package lora

import (
	"errors"
	"slices"
	"time"
)

// Holdings are one worker's loads and loaded adapters. The zero value
// holds none.
type Holdings struct {
	loads  map[string]*Load     // being loaded by Sluice, by adapter name
	loaded map[string]time.Time // loaded by Sluice, until telemetry lists them
}

// Load is a load of one adapter on one worker: started at a bind, made
// by the first request bound to it that gets ready, waited for by the
// others.
type Load struct {
	Name, Base string
	// turn holds the one right to make the load until a request takes it.
	turn chan struct{}
	// leases counts the requests bound to it and not released, under the
	// owner's lock.
	leases int
	done   chan struct{}
	err    error // set before done is closed
}

// ErrAbandoned ends a load that every request bound to it was released
// before making; no request is left to read it.
var ErrAbandoned = errors.New("every request bound to the load left before it was made")

// Holds reports whether the worker holds adapter name or is loading it;
// reported says its telemetry lists it. Once the telemetry lists an
// adapter Sluice loaded there, the telemetry alone says: a worker that
// restarts without it stops holding it at its next scrape.
func (h *Holdings) Holds(name string, reported bool) bool {
	if h.loads[name] != nil {
		return true
	}
	if reported {
		delete(h.loaded, name)
		return true
	}
	_, ok := h.loaded[name]
	return ok
}

// Loading returns the load of adapter name running or due on the worker,
// nil when none, with one more request bound to it.
func (h *Holdings) Loading(name string) *Load {
	ld := h.loads[name]
	if ld != nil {
		ld.leases++
	}
	return ld
}

// Start returns a new load of the adapter, with its first request bound.
func (h *Holdings) Start(name, base string) *Load {
	if h.loads == nil {
		h.loads = map[string]*Load{}
	}
	ld := &Load{Name: name, Base: base, turn: make(chan struct{}, 1), leases: 1, done: make(chan struct{})}
	ld.turn <- struct{}{}
	h.loads[name] = ld
	return ld
}

// Leave counts the release of a request bound to ld: when it was the
// last one and none of them started the load, nobody is left to make it,
// and it is forgotten (the worker does not hold the adapter), so that
// later requests do not wait for it.
func (h *Holdings) Leave(ld *Load) {
	ld.leases--
	if ld.leases > 0 {
		return
	}
	select {
	case <-ld.turn:
		ld.err = ErrAbandoned
		h.forget(ld)
		close(ld.done)
	default: // made, or being made by a request that has not returned
	}
}

// Settle ends ld, made with the outcome err at now: the worker holds the
// adapter from now on, or, when it failed, does not.
func (h *Holdings) Settle(ld *Load, err error, now time.Time) {
	ld.err = err
	h.forget(ld)
	if err == nil {
		if h.loaded == nil {
			h.loaded = map[string]time.Time{}
		}
		h.loaded[ld.Name] = now
	}
	close(ld.done)
}

func (h *Holdings) forget(ld *Load) {
	if h.loads[ld.Name] == ld {
		delete(h.loads, ld.Name)
	}
}

// Loaded returns the names of the adapters Sluice loaded that the
// telemetry does not list yet, with when, sorted by name.
func (h *Holdings) Loaded() (names []string, at []time.Time) {
	for _, n := range sortedKeys(h.loaded) {
		names, at = append(names, n), append(at, h.loaded[n])
	}
	return names, at
}

// Loads returns the loads running or due, sorted by adapter name.
func (h *Holdings) Loads() []*Load {
	var out []*Load
	for _, n := range sortedKeys(h.loads) {
		out = append(out, h.loads[n])
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Turn is ready when the caller may make the load: the first to receive
// from it does, and must Settle it.
func (ld *Load) Turn() <-chan struct{} { return ld.turn }

// Done is closed when the load has ended; Err then says how.
func (ld *Load) Done() <-chan struct{} { return ld.done }

// Err is the load's outcome, once Done is closed.
func (ld *Load) Err() error { return ld.err }
