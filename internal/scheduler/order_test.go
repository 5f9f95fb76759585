package scheduler

import (
	"strings"
	"testing"
	"time"
)

// Each rule of the queue order is a field of the key and a line of
// order.less; one row per rule.
func TestOrder_Less(t *testing.T) {
	q, other := &queue{}, &queue{}
	t0 := time.Unix(1000, 0)
	o := order{overtake: 10 * time.Second}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	cases := []struct {
		name string
		a, b key
		want bool // a before b
	}{
		{"retries first", key{q: q, retry: true, cls: 1, seq: 9}, key{q: q, cls: 0, seq: 1}, true},
		{"retries among themselves by class then arrival", key{q: q, retry: true, cls: 0, seq: 9}, key{q: other, retry: true, cls: 0, seq: 3}, false},
		{"higher class first within the aging bound",
			key{q: q, cls: 0, seq: 5, enq: at(10)}, key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, true},
		{"aging: a lower class passed by more than the bound goes first",
			key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, key{q: q, cls: 0, seq: 5, enq: at(11)}, true},
		{"aging is measured from the lower class's oldest",
			key{q: q, cls: 1, seq: 4, enq: at(5), oldest: at(0)}, key{q: q, cls: 0, seq: 5, enq: at(11)}, true},
		{"fair share: the tenant with the lower start tag",
			key{q: q, seq: 9, tenantTag: 1, tenantFirst: 9}, key{q: q, seq: 2, tenantTag: 2, tenantFirst: 2}, true},
		{"fair share: equal tenant tags go to the older tenant",
			key{q: q, seq: 9, tenantTag: 1, tenantFirst: 9}, key{q: q, seq: 2, tenantTag: 1, tenantFirst: 2}, false},
		{"fair share: within a tenant the flow with the lower start tag",
			key{q: q, seq: 9, tenantFirst: 1, flowTag: 1, flowFirst: 9}, key{q: q, seq: 1, tenantFirst: 1, flowTag: 3, flowFirst: 1}, true},
		{"fair share: equal flow tags go to the older flow",
			key{q: q, seq: 9, tenantFirst: 1, flowTag: 1, flowFirst: 9}, key{q: q, seq: 1, tenantFirst: 1, flowTag: 1, flowFirst: 1}, false},
		{"across models: class, then arrival, no tags",
			key{q: q, cls: 0, seq: 9, tenantTag: 5}, key{q: other, cls: 0, seq: 1}, false},
		{"across models: no aging",
			key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, key{q: other, cls: 0, seq: 9, enq: at(60)}, false},
	}
	for _, c := range cases {
		if got := o.less(c.a, c.b); got != c.want {
			t.Errorf("%s: less = %v, want %v", c.name, got, c.want)
		}
		if c.a != c.b && o.less(c.b, c.a) == c.want && c.a.q != c.b.q {
			t.Errorf("%s: less is not antisymmetric across models", c.name)
		}
	}
}

// keyOf reads a queued request's fair-share position and aging base from
// its queue.
func TestQueue_KeyOf(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := newQueue(2, t0)
	mk := func(seq uint64, cls int, tenant, flow string, cost float64, s int) *Ticket {
		tk := &Ticket{seq: seq, cls: cls, cost: cost, enq: t0.Add(time.Duration(s) * time.Second), req: Request{Tenant: tenant, Flow: flow}}
		q.push(tk, 1)
		return tk
	}
	a1 := mk(1, 1, "a", "x", 100, 0)
	a2 := mk(2, 1, "a", "y", 100, 1)
	b1 := mk(3, 1, "b", "x", 100, 2)
	hi := mk(4, 0, "a", "x", 100, 12)
	q.remove(a1, true) // a is charged 100, its flow x 100; flow y not
	k := q.keyOf(a2)
	if k.tenantTag != 100 || k.flowTag != 0 || k.tenantFirst != 2 || k.oldest != a2.enq {
		t.Fatalf("key of a2 = %+v", k)
	}
	if kb := q.keyOf(b1); kb.tenantTag != 0 || !(order{}).less(kb, k) {
		t.Fatalf("b, not yet served, must go before a: %+v", kb)
	}
	// hi came 11s after the batch class's oldest (a2, at 1s): over the
	// bound, the batch class's first (b) goes before it.
	o := order{overtake: 10 * time.Second}
	if got := q.next(o); got != b1 {
		t.Fatalf("next = seq %d, want b (seq 3)", got.seq)
	}
	if got := q.next(order{overtake: time.Minute}); got != hi {
		t.Fatalf("within the bound next = seq %d, want the interactive request", got.seq)
	}
}

// The placement check answers, for one request, whether it can be placed
// now and, when not, which rule holds it; a request that only waits for
// room, as every request of its model does, is held by no rule.
func TestCanPlace(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := workers(1, 2, "m")
	ws[0].Source = newSource(Snapshot{Health: HealthOK, KVPoolTokens: 8192})
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
		tk := &Ticket{req: c.req, enq: now}
		s.mu.Lock()
		pc := s.pickLocked(tk.req, tk.enq, now, false)
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
