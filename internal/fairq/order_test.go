package fairq

import (
	"testing"
	"time"
)

// Each rule of the queue order is a field of the key and a line of
// Order.Less; one row per rule.
func TestOrder_Less(t *testing.T) {
	q, other := New[string](2), New[string](2)
	t0 := time.Unix(1000, 0)
	o := Order{Overtake: 10 * time.Second}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	cases := []struct {
		name string
		a, b Key
		want bool // a before b
	}{
		{"retries first", Key{q: q, retry: true, cls: 1, seq: 9}, Key{q: q, cls: 0, seq: 1}, true},
		{"retries among themselves by class then arrival", Key{q: q, retry: true, cls: 0, seq: 9}, Key{q: other, retry: true, cls: 0, seq: 3}, false},
		{"higher class first within the aging bound",
			Key{q: q, cls: 0, seq: 5, enq: at(10)}, Key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, true},
		{"aging: a lower class passed by more than the bound goes first",
			Key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, Key{q: q, cls: 0, seq: 5, enq: at(11)}, true},
		{"aging is measured from the lower class's oldest",
			Key{q: q, cls: 1, seq: 4, enq: at(5), oldest: at(0)}, Key{q: q, cls: 0, seq: 5, enq: at(11)}, true},
		{"fair share: the tenant with the lower start tag",
			Key{q: q, seq: 9, tenantTag: 1, tenantFirst: 9}, Key{q: q, seq: 2, tenantTag: 2, tenantFirst: 2}, true},
		{"fair share: equal tenant tags go to the older tenant",
			Key{q: q, seq: 9, tenantTag: 1, tenantFirst: 9}, Key{q: q, seq: 2, tenantTag: 1, tenantFirst: 2}, false},
		{"fair share: within a tenant the flow with the lower start tag",
			Key{q: q, seq: 9, tenantFirst: 1, flowTag: 1, flowFirst: 9}, Key{q: q, seq: 1, tenantFirst: 1, flowTag: 3, flowFirst: 1}, true},
		{"fair share: equal flow tags go to the older flow",
			Key{q: q, seq: 9, tenantFirst: 1, flowTag: 1, flowFirst: 9}, Key{q: q, seq: 1, tenantFirst: 1, flowTag: 1, flowFirst: 1}, false},
		{"across queues: class, then arrival, no tags",
			Key{q: q, cls: 0, seq: 9, tenantTag: 5}, Key{q: other, cls: 0, seq: 1}, false},
		{"across queues: no aging",
			Key{q: q, cls: 1, seq: 1, enq: at(0), oldest: at(0)}, Key{q: other, cls: 0, seq: 9, enq: at(60)}, false},
	}
	for _, c := range cases {
		if got := o.Less(c.a, c.b); got != c.want {
			t.Errorf("%s: Less = %v, want %v", c.name, got, c.want)
		}
		if c.a != c.b && o.Less(c.b, c.a) == c.want && c.a.q != c.b.q {
			t.Errorf("%s: Less is not antisymmetric across queues", c.name)
		}
	}
}

// KeyOf reads a waiting request's fair-share position and aging base
// from its queue.
func TestQueue_KeyOf(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := New[string](2)
	mk := func(name string, seq uint64, cls int, tenant, flow string, cost float64, s int) *Entry[string] {
		e := &Entry[string]{Item: name, Seq: seq, Class: cls, Cost: cost, Arrival: t0.Add(time.Duration(s) * time.Second), Tenant: tenant, Flow: flow}
		q.Push(e, 1)
		return e
	}
	a1 := mk("a1", 1, 1, "a", "x", 100, 0)
	a2 := mk("a2", 2, 1, "a", "y", 100, 1)
	b1 := mk("b1", 3, 1, "b", "x", 100, 2)
	mk("hi", 4, 0, "a", "x", 100, 12)
	q.Remove(a1, true) // a is charged 100, its flow x 100; flow y not
	k := q.KeyOf(a2)
	if k.tenantTag != 100 || k.flowTag != 0 || k.tenantFirst != 2 || k.oldest != a2.Arrival {
		t.Fatalf("key of a2 = %+v", k)
	}
	if kb := q.KeyOf(b1); kb.tenantTag != 0 || !(Order{}).Less(kb, k) {
		t.Fatalf("b, not yet served, must go before a: %+v", kb)
	}
	// hi came 11s after the batch class's oldest (a2, at 1s): over the
	// bound, the batch class's first (b) goes before it.
	if got := q.Next(Order{Overtake: 10 * time.Second}); got != "b1" {
		t.Fatalf("next = %s, want b1", got)
	}
	if got := q.Next(Order{Overtake: time.Minute}); got != "hi" {
		t.Fatalf("within the bound next = %s, want the interactive request", got)
	}
}
