package scheduler

import "time"

// The queue order.
//
// Every waiting request has one ordering key (keyOf) and the order
// compares keys (order.less); every rule of who goes first is a field of
// the key and a line of less:
//
//   - Retries first: a retry was accepted before everyone waiting. Within
//     one model's queue retries go in the order they joined it.
//   - Class: the higher-priority class goes first, bounded by aging: a
//     request is never passed by one of a higher class that arrived more
//     than the bound (MaxOvertake) after the oldest of its own class.
//   - Fair share within a class: the tenant with the lowest start tag,
//     then within it the flow with the lowest start tag, ties to the one
//     whose oldest request came first (start-time fair queueing; see
//     queue). Only a flow's oldest request has such a key: within a flow
//     requests go in arrival order.
//   - Across models' queues, whose tags are not comparable: class, then
//     arrival.
//
// Whether the request that comes first in this order can be placed now,
// and which request behind it may be placed when it cannot, is the
// placement check's (choice.placeable, dispatch.go).

// key is a waiting request's place in the queue order.
type key struct {
	q     *queue // its model's queue: fair-share tags compare within one
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

// keyOf is t's ordering key in q, where t waits (a retry, or the oldest
// request of its flow).
func (q *queue) keyOf(t *Ticket) key {
	if t.front {
		return q.keyIn(t, nil, nil)
	}
	cq := &q.classes[t.cls]
	return q.keyIn(t, cq.oldest(), cq.tenants[t.req.Tenant].oldest())
}

// keyIn is keyOf given the oldest request of t's class and of its tenant
// in that class, which a scan of the whole queue finds once for all.
func (q *queue) keyIn(t, classOldest, tenantOldest *Ticket) key {
	k := key{q: q, retry: t.front, cls: t.cls, seq: t.seq, enq: t.enq}
	if t.front {
		return k
	}
	tq := q.classes[t.cls].tenants[t.req.Tenant]
	f := tq.flows[t.req.Flow]
	k.oldest = classOldest.enq
	k.tenantTag, k.tenantFirst = tq.start, tenantOldest.seq
	k.flowTag, k.flowFirst = f.start, f.arrivals[0].seq
	return k
}

// order compares ordering keys; overtake is the aging bound across
// classes.
type order struct {
	overtake time.Duration
}

// less reports whether a goes before b. Between classes of one queue it
// is the aging rule, which is not transitive across three classes: the
// queue's next request is the least of its classes' first requests taken
// in priority order (queue.next).
func (o order) less(a, b key) bool {
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
		return a.enq.Sub(b.oldest) <= o.overtake
	case a.cls > b.cls:
		return b.enq.Sub(a.oldest) > o.overtake
	case a.tenantTag != b.tenantTag:
		return a.tenantTag < b.tenantTag
	case a.tenantFirst != b.tenantFirst:
		return a.tenantFirst < b.tenantFirst
	case a.flowTag != b.flowTag:
		return a.flowTag < b.flowTag
	}
	return a.flowFirst < b.flowFirst
}

// compare is less as a three-way comparison, for sorting.
func (o order) compare(a, b key) int {
	switch {
	case o.less(a, b):
		return -1
	case o.less(b, a):
		return 1
	}
	return 0
}
