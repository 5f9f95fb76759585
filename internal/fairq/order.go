package fairq

import "time"

// The queue order.
//
// Every waiting request has one ordering key (KeyOf) and the order
// compares keys (Order.Less); every rule of who goes first is a field of
// the key and a line of Less:
//
//   - Retries first: a retry was accepted before everyone waiting. Within
//     one queue retries go in the order they joined it.
//   - Class: the higher-priority class goes first, bounded by aging: a
//     request is never passed by one of a higher class that arrived more
//     than the bound (Order.Overtake) after the oldest of its own class.
//   - Fair share within a class: the tenant with the lowest start tag,
//     then within it the flow with the lowest start tag, ties to the one
//     whose oldest request came first (start-time fair queueing; see
//     Queue). Only a flow's oldest request has such a key: within a flow
//     requests go in arrival order.
//   - Across queues (one per model), whose tags are not comparable:
//     class, then arrival.
//
// Whether the request that comes first in this order can be placed now,
// and which request behind it may be placed when it cannot, is the
// caller's to decide.

// Key is a waiting request's place in the queue order.
type Key struct {
	q     any // its queue (a *Queue[T]): fair-share tags compare within one
	retry bool
	cls   int
	seq   uint64
	enq   time.Time
	// oldest is when the oldest request of its class in its queue came:
	// what the aging bound is measured from.
	oldest time.Time
	// Fair-share position: the tenant's start tag and its oldest
	// request's sequence number, then the same of the flow.
	tenantTag   float64
	tenantFirst uint64
	flowTag     float64
	flowFirst   uint64
}

// KeyOf is e's ordering key in q, where e waits (a retry, or the oldest
// request of its flow).
func (q *Queue[T]) KeyOf(e *Entry[T]) Key {
	if e.Retry {
		return q.keyIn(e, nil, nil)
	}
	cq := &q.classes[e.Class]
	return q.keyIn(e, cq.oldest(), cq.tenants[e.Tenant].oldest())
}

// keyIn is KeyOf given the oldest request of e's class and of its tenant
// in that class, which a scan of the whole queue finds once for all.
func (q *Queue[T]) keyIn(e, classOldest, tenantOldest *Entry[T]) Key {
	k := Key{q: q, retry: e.Retry, cls: e.Class, seq: e.Seq, enq: e.Arrival}
	if e.Retry {
		return k
	}
	tq := q.classes[e.Class].tenants[e.Tenant]
	f := tq.flows[e.Flow]
	k.oldest = classOldest.Arrival
	k.tenantTag, k.tenantFirst = tq.start, tenantOldest.Seq
	k.flowTag, k.flowFirst = f.start, f.arrivals[0].Seq
	return k
}

// Order compares ordering keys.
type Order struct {
	// Overtake is the aging bound across classes.
	Overtake time.Duration
}

// Less reports whether a goes before b. Between classes of one queue it
// is the aging rule, which is not transitive across three classes: the
// queue's next request is the least of its classes' first requests taken
// in priority order (Queue.Next).
func (o Order) Less(a, b Key) bool {
	if a.retry != b.retry {
		return a.retry
	}
	if a.q != b.q || a.retry {
		if a.cls != b.cls {
			return a.cls < b.cls
		}
		return a.seq < b.seq
	}
	switch {
	case a.cls < b.cls:
		return a.enq.Sub(b.oldest) <= o.Overtake
	case a.cls > b.cls:
		return b.enq.Sub(a.oldest) > o.Overtake
	case a.tenantTag != b.tenantTag:
		return a.tenantTag < b.tenantTag
	case a.tenantFirst != b.tenantFirst:
		return a.tenantFirst < b.tenantFirst
	case a.flowTag != b.flowTag:
		return a.flowTag < b.flowTag
	}
	return a.flowFirst < b.flowFirst
}

// Compare is Less as a three-way comparison, for sorting.
func (o Order) Compare(a, b Key) int {
	switch {
	case o.Less(a, b):
		return -1
	case o.Less(b, a):
		return 1
	}
	return 0
}
