// Package lora keeps what Sluice knows of the LoRA adapters on one worker
// beyond its telemetry: the loads it makes there and the adapters it
// loaded. The scheduler owns one Holdings per worker and updates it under
// its lock; a Load is made outside the lock, by the first request bound to
// it that gets ready (it takes the turn), and waited for by the others.
package lora

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Spec is a LoRA adapter the configuration names.
type Spec struct {
	// Name is what requests put in "model".
	Name string `json:"name"`
	// Base is the model the adapter applies to.
	Base string `json:"base"`
	// Path is where a worker loads it from (vLLM's lora_path).
	Path string `json:"path,omitempty"`
}

// Info is an adapter a worker reports holding.
type Info struct {
	// Name is the adapter's name (vLLM's model id; for llama.cpp the
	// configured name of its file, else the file's base name).
	Name string `json:"name"`
	// Base is the model it applies to, when the worker says.
	Base string `json:"base,omitempty"`
	// Source names where this came from, e.g. "vllm /v1/models".
	Source string `json:"source,omitempty"`
}

// Loader loads an adapter on a worker (vLLM's POST /v1/load_lora_adapter).
// It is called outside the scheduler's lock.
type Loader interface {
	LoadAdapter(ctx context.Context, worker string, a Spec) error
}

// Config configures LoRA adapters.
type Config struct {
	// Adapters are the adapters the configuration names.
	Adapters []Spec
	// LoadOnDemand lets a request for a configured adapter go to a worker
	// that can load it when no holder has room.
	LoadOnDemand bool
	// MaxReplicas bounds how many workers may hold an adapter loaded on
	// demand; DefaultReplicas when 0.
	MaxReplicas int
	// Loader makes the loads; without one nothing is loaded on demand.
	Loader Loader
	// LoadTimeout bounds one load; DefaultLoadTimeout when 0.
	LoadTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultReplicas    = 2
	DefaultLoadTimeout = 2 * time.Minute
)

// Replicas is MaxReplicas, or its default.
func (c *Config) Replicas() int {
	if c.MaxReplicas > 0 {
		return c.MaxReplicas
	}
	return DefaultReplicas
}

// Timeout is LoadTimeout, or its default.
func (c *Config) Timeout() time.Duration {
	if c.LoadTimeout > 0 {
		return c.LoadTimeout
	}
	return DefaultLoadTimeout
}

// State is one adapter a worker holds or is loading, for the admin view.
type State struct {
	Name   string    `json:"name"`
	Base   string    `json:"base,omitempty"`
	State  string    `json:"state"` // "loaded" or "loading"
	Source string    `json:"source,omitempty"`
	At     time.Time `json:"loaded_at,omitzero"`
}

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
// reported is what its telemetry lists. Once the telemetry lists an
// adapter Sluice loaded there, the telemetry alone says: a worker that
// restarts without it stops holding it at its next scrape.
func (h *Holdings) Holds(name string, reported []Info) bool {
	if h.loads[name] != nil {
		return true
	}
	if slices.ContainsFunc(reported, func(ai Info) bool { return ai.Name == name }) {
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

// States lists what the worker holds: what it reports, what Sluice loaded
// there, and what it is loading, sorted by name.
func (h *Holdings) States(reported []Info) []State {
	var out []State
	for _, ai := range reported {
		out = append(out, State{Name: ai.Name, Base: ai.Base, State: "loaded", Source: ai.Source})
	}
	names, at := h.Loaded()
	for i, name := range names {
		if !slices.ContainsFunc(out, func(a State) bool { return a.Name == name }) {
			out = append(out, State{Name: name, State: "loaded", Source: "loaded by Sluice", At: at[i]})
		}
	}
	for _, ld := range h.Loads() {
		out = append(out, State{Name: ld.Name, Base: ld.Base, State: "loading", Source: "loading by Sluice"})
	}
	slices.SortFunc(out, func(a, b State) int {
		if a.Name < b.Name {
			return -1
		} else if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
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

// Error is the load's failure on worker as a request's error; nil when it
// succeeded.
func (ld *Load) Error(worker string) error {
	if ld.err == nil {
		return nil
	}
	return fmt.Errorf("load LoRA adapter %q on %s: %w", ld.Name, worker, ld.err)
}
