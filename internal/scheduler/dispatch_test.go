package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// The placement check answers, for one request, whether it can be placed
// now and, when not, which rule holds it; a request that only waits for
// room, as every request of its model does, is held by no rule.
func TestCanPlace(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := workers(1, 2, "m")
	ws[0].Source = newSource(snapshot.Snapshot{Health: snapshot.HealthOK, KVPoolTokens: 8192})
	s := newSched(t, Config{MaxQueue: 10, Clock: fixedClock{now}, KVFit: true}, ws...)
	held := admitNow(t, s, Request{Model: "m", PromptTokens: 4500, MaxTokens: 100})
	cases := []struct {
		name   string
		req    Request
		full   bool
		ok     bool
		why    hold
		reason string
	}{
		{"fits", Request{Model: "m", PromptTokens: 500, MaxTokens: 100}, false, true, holdNone, ""},
		{"kv-fit holds a prompt no cache has room for", Request{Model: "m", PromptTokens: 4000, MaxTokens: 100}, false, false, holdKVFit, "the KV-fit rule held it: its prompt of ~4000 tokens"},
		{"waiting for room is no rule's hold", Request{Model: "m", PromptTokens: 500, MaxTokens: 100}, true, false, holdNone, ""},
	}
	for _, c := range cases {
		var extra *Lease
		if c.full {
			extra = admitNow(t, s, Request{Model: "m", PromptTokens: 10, MaxTokens: 10})
		}
		tk := &Ticket{req: c.req}
		tk.entry.Arrival = now
		s.mu.Lock()
		pc := s.pickLocked(tk.req, tk.entry.Arrival, now, false)
		s.mu.Unlock()
		ok, why := pc.placeable()
		if ok != c.ok || why != c.why || (ok && pc.w == nil) {
			t.Errorf("%s: ok %v why %d, want ok %v why %d", c.name, ok, why, c.ok, c.why)
		}
		if c.reason != "" && !strings.Contains(why.explain(tk), c.reason) {
			t.Errorf("%s: explain %q, want it to name %q", c.name, why.explain(tk), c.reason)
		}
		if extra != nil {
			extra.Release()
		}
	}
	held.Release()
}
