package server

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// kvEvents follows the KV-cache events of every worker configured with
// kv_events into one exact index, the scheduler's Config.KVIndex, and
// gets requests' token blocks from those workers' /tokenize
// (Server.kvBlocks, the proxy's KVBlocks hook).
//
// One kvevents.Subscriber runs per such worker, started when the worker
// is added and stopped (its goroutine waited for) when it is removed or
// replaced and when the router closes; its index is forgotten with it.
// Until then it dials its publisher for as long as it takes (a vLLM
// loading its model opens the socket minutes after Sluice starts), and
// it connects again, starting the index over, when the worker comes back
// from down or loading: another process may answer there now.
type kvEvents struct {
	index *kvevents.Index
	log   *slog.Logger

	mu   sync.Mutex
	subs map[string]*kvSub

	cache *tokenCache
	// timeout bounds a /tokenize call (tokenizeTimeout).
	timeout time.Duration
}

type kvSub struct {
	sub    *kvevents.Subscriber
	cancel context.CancelFunc
	done   chan struct{}
	down   bool // its worker was last seen down or loading (guarded by kvEvents.mu)
}

func newKVEvents(log *slog.Logger, timeout time.Duration) *kvEvents {
	return &kvEvents{index: kvevents.NewIndex(), log: log, subs: map[string]*kvSub{}, cache: newTokenCache(tokenCacheSize), timeout: timeout}
}

// start subscribes to w's events, if it publishes any.
func (k *kvEvents) start(w config.Worker) {
	if w.KVEvents == "" {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ks := &kvSub{cancel: cancel, done: make(chan struct{}),
		sub: &kvevents.Subscriber{Worker: w.Name, Endpoint: w.KVEvents, Replay: w.KVEventsReplay, Index: k.index, Logger: k.log}}
	k.mu.Lock()
	old := k.subs[w.Name]
	k.subs[w.Name] = ks
	k.mu.Unlock()
	if old != nil {
		old.stop()
	}
	go func() {
		defer close(ks.done)
		if err := ks.sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			k.log.Error("KV events: subscriber stopped", "worker", w.Name, "endpoint", w.KVEvents, "err", err)
		}
	}()
}

func (ks *kvSub) stop() {
	ks.cancel()
	<-ks.done
}

// health takes a worker's new health. A worker back to ok from down or
// loading may be a restarted engine, holding none of the indexed blocks,
// behind a connection that never saw the old one go (a peer gone without
// a reset), so its subscriber connects again, which starts the index
// over; when it was the same process, the replay from its buffer rebuilds
// the index.
func (k *kvEvents) health(name string, h snapshot.Health) {
	k.mu.Lock()
	ks := k.subs[name]
	again := false
	if ks != nil {
		switch h {
		case snapshot.HealthDown, snapshot.HealthLoading:
			ks.down = true
		case snapshot.HealthOK:
			again, ks.down = ks.down, false
		}
	}
	k.mu.Unlock()
	if again {
		ks.sub.Reconnect()
	}
}

// stop ends name's subscription and forgets its index.
func (k *kvEvents) stop(name string) {
	k.mu.Lock()
	ks := k.subs[name]
	delete(k.subs, name)
	k.mu.Unlock()
	if ks != nil {
		ks.stop()
	}
	k.index.Forget(name)
}

// close ends every subscription.
func (k *kvEvents) close() {
	for _, n := range k.names() {
		k.stop(n)
	}
}

// kvView is a worker's index of KV events in GET /api/workers.
type kvView struct {
	kvevents.Stats
	// State is "connecting" (no connection to the publisher: dialing, or
	// waiting to dial again), "connected" (no batch since it connected),
	// "synced" (the index is exact) or "out_of_sync" (batches lost and
	// not replayed: the prefix term guesses for the worker).
	State string `json:"state"`
	// LastError is the latest failure (a dial, a lost connection, a
	// replay) and LastErrorAt when; absent before any.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Connects counts the connections made to the publisher.
	Connects int `json:"connects"`
	// Gaps counts the seq gaps seen, Replays those the replay socket
	// repaired.
	Gaps    int `json:"gaps"`
	Replays int `json:"replays"`
}

// view is name's index state, nil when it is not subscribed.
func (k *kvEvents) view(name string) *kvView {
	k.mu.Lock()
	ks := k.subs[name]
	k.mu.Unlock()
	if ks == nil {
		return nil
	}
	st, _ := k.index.Stats(name)
	cs := ks.sub.Status()
	v := &kvView{Stats: st, LastError: cs.LastError, Connects: cs.Connects}
	if !cs.LastErrorAt.IsZero() {
		v.LastErrorAt = &cs.LastErrorAt
	}
	switch {
	case !cs.Connected:
		v.State = "connecting"
	case st.Seq < 0:
		v.State = "connected"
	case st.Synced:
		v.State = "synced"
	default:
		v.State = "out_of_sync"
	}
	v.Gaps, v.Replays = ks.sub.Counts()
	return v
}

// names are the subscribed workers, in name order.
func (k *kvEvents) names() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.subs))
}

// kvBlocks is the proxy's KVBlocks hook: the keys of the request's token
// blocks (kvevents.BlockKeys), cut from the token ids a healthy worker
// with kv_events serving model gives at POST /tokenize, in the block size
// its events report; nil when no such worker has reported one, or it
// fails. It runs before the request is submitted, never under the
// scheduler's lock.
func (s *Server) kvBlocks(ctx context.Context, model string, in proxy.TokenizeInput) []uint64 {
	k := s.kv
	name, bs := "", 0
	for _, n := range k.names() {
		fw := s.fleet.Get(n)
		if fw == nil {
			continue
		}
		snap := fw.Snapshot()
		if snap == nil || snap.Health != snapshot.HealthOK || !slices.Contains(snap.Models, model) {
			continue
		}
		if st, ok := k.index.Stats(n); ok && st.BlockSize > 0 {
			name, bs = n, st.BlockSize
			break
		}
	}
	if name == "" {
		return nil
	}
	key := tokenKey(model, bs, in)
	if keys, ok := k.cache.get(key); ok {
		return keys
	}
	// The timeout only here: a request to a fleet without KV events
	// pays for no context or timer.
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	out, err := s.postTokenize(ctx, name, tokenizeBody(model, in))
	if err != nil {
		s.log.Debug("KV events: no token ids; the prefix term keeps the guess", "worker", name, "err", err)
		return nil
	}
	keys := kvevents.BlockKeys(out.Tokens, bs)
	k.cache.put(key, keys)
	return keys
}

// tokenizeBody is the /tokenize request for in: vLLM's
// TokenizeChatRequest, {"model", "messages"} and the chat template's other
// fields as the request sent them, or TokenizeCompletionRequest, {"model",
// "prompt"}.
func tokenizeBody(model string, in proxy.TokenizeInput) map[string]any {
	body := map[string]any{"model": model}
	if len(in.Messages) > 0 {
		body["messages"] = in.Messages
		for _, f := range in.Template {
			body[f.Name] = f.Value
		}
	} else {
		body["prompt"] = in.Prompt
	}
	return body
}

// tokenCacheSize bounds the prompts whose block keys are remembered.
const tokenCacheSize = 4096

// tokenCache remembers the block keys of recent prompts, least recently
// used first out, so that a prompt sent again — a retry, a regenerated
// answer, the same question behind the same system prompt — is not
// tokenized again. Its key is a digest of the model, the block size and
// the prompt as sent; what it holds is the keys, one per block, not the
// token ids.
type tokenCache struct {
	mu  sync.Mutex
	max int
	ll  *list.List // of *tokenEntry, most recent first
	at  map[uint64]*list.Element
}

type tokenEntry struct {
	key  uint64
	keys []uint64
}

func newTokenCache(n int) *tokenCache {
	return &tokenCache{max: n, ll: list.New(), at: map[uint64]*list.Element{}}
}

func (c *tokenCache) get(key uint64) ([]uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.at[key]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(e)
	return e.Value.(*tokenEntry).keys, true
}

func (c *tokenCache) put(key uint64, keys []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.at[key]; ok {
		e.Value.(*tokenEntry).keys = keys
		c.ll.MoveToFront(e)
		return
	}
	c.at[key] = c.ll.PushFront(&tokenEntry{key, keys})
	for c.ll.Len() > c.max {
		old := c.ll.Remove(c.ll.Back()).(*tokenEntry)
		delete(c.at, old.key)
	}
}

// tokenKey digests what a prompt's token blocks depend on.
func tokenKey(model string, bs int, in proxy.TokenizeInput) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%d\x00", model, bs)
	h.Write(in.Messages)
	h.Write([]byte{0})
	for _, f := range in.Template {
		fmt.Fprintf(h, "%s\x00%d\x00", f.Name, len(f.Value))
		h.Write(f.Value)
	}
	h.Write([]byte{0})
	h.Write(in.Prompt)
	return h.Sum64()
}

// WaitKVEvents blocks until cond holds for worker's index of KV events,
// or ctx ends. A ZeroMQ subscriber misses what is published before it
// has joined, so a harness that drives a fleet through the router waits
// here for each worker's first batch before it sends load.
func (s *Server) WaitKVEvents(ctx context.Context, worker string, cond func(kvevents.Stats) bool) error {
	return s.kv.index.Wait(ctx, worker, cond)
}

// KVEventsState is worker's index of KV events as GET /api/workers
// shows it: its stats, and how many seq gaps were seen and how many of
// them the replay socket repaired; ok is false when the worker is not
// subscribed.
func (s *Server) KVEventsState(worker string) (st kvevents.Stats, gaps, replays int, ok bool) {
	v := s.kv.view(worker)
	if v == nil {
		return kvevents.Stats{Seq: -1}, 0, 0, false
	}
	return v.Stats, v.Gaps, v.Replays, true
}
