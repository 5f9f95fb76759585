package scheduler

import (
	"container/heap"
	"time"
)

// Class is a priority class of requests. Classes are served in strict
// priority order, bounded by the aging rule (see Config.MaxOvertake), and
// each has its own queueing deadline.
type Class struct {
	// Name is what a request names (the X-Sluice-Priority header).
	Name string `yaml:"name" json:"name"`
	// Priority orders the classes: lower is served first.
	Priority int `yaml:"priority" json:"priority"`
	// MaxQueueWait is the class's deadline in the queue: a request that
	// cannot be bound within it is refused at once (deadline_unmeetable)
	// rather than served late, and one that waits that long times out.
	// 0 takes the queue timeout.
	MaxQueueWait time.Duration `yaml:"max_queue_wait" json:"max_queue_wait,omitempty"`
}

// DefaultClasses are the classes used when none are configured:
// "interactive" (the default class) before "batch".
func DefaultClasses() []Class {
	return []Class{{Name: "interactive", Priority: 0}, {Name: "batch", Priority: 1}}
}

// DefaultMaxOvertake is the aging bound used when Config.MaxOvertake is 0.
const DefaultMaxOvertake = 10 * time.Second

// queue is one model's waiting requests. It exists only while requests
// wait (a backlog): it is created by the first and deleted with the last,
// so client-supplied model names leave no state behind.
//
// Order, for the next request to bind: retries first, in arrival order.
// Then the highest-priority class that waits, unless a lower class holds a
// request that arrived more than maxOvertake before that class's pick: a
// request is never overtaken by a higher class that arrived more than
// maxOvertake after it. Within a class, tenants share by token cost with
// start-time fair queueing (the flow with the lowest start tag goes next;
// serving a request of cost c advances its flow's tag by c/weight). Within
// a tenant the cheapest request goes first, unless the tenant's oldest
// arrived more than maxOvertake before it, in which case the oldest does.
type queue struct {
	since   time.Time // when this backlog began
	spec    bool      // no worker was known to serve the model when it was created
	retries []*Ticket // in arrival order
	classes []classQueue
	n       int     // requests waiting, retries included
	work    float64 // their expected cost in tokens
}

// classQueue is one class's part of a model's queue: a flow per tenant
// and the class's virtual time.
type classQueue struct {
	flows map[string]*flow
	v     float64 // start tag of the request of this class bound last
	n     int
	work  float64
}

// flow is one tenant's requests of one class.
type flow struct {
	weight   float64
	start    float64   // start tag of the flow's next request
	arrivals []*Ticket // by arrival; entries no longer in byCost are dead
	dead     int
	byCost   costHeap
	work     float64
}

func newQueue(nclasses int, now time.Time) *queue {
	return &queue{since: now, classes: make([]classQueue, nclasses)}
}

// push adds t to the queue.
func (q *queue) push(t *Ticket, weight float64) {
	q.n++
	q.work += t.cost
	if t.front {
		q.retries = append(q.retries, t)
		return
	}
	cq := &q.classes[t.cls]
	cq.n++
	cq.work += t.cost
	if cq.flows == nil {
		cq.flows = map[string]*flow{}
	}
	f := cq.flows[t.req.flow()]
	if f == nil {
		f = &flow{weight: weight, start: cq.v}
		cq.flows[t.req.flow()] = f
	}
	if len(f.byCost) == 0 {
		f.start = max(f.start, cq.v) // a flow idle for a while gets no credit
	}
	f.arrivals = append(f.arrivals, t)
	heap.Push(&f.byCost, t)
	f.work += t.cost
}

// remove takes t out of the queue. When bound is set t is being served:
// its flow is charged its cost and the class's virtual time moves to the
// flow's start tag.
func (q *queue) remove(t *Ticket, bound bool) {
	q.n--
	q.work -= t.cost
	if t.front {
		for i, x := range q.retries {
			if x == t {
				q.retries = append(q.retries[:i], q.retries[i+1:]...)
				break
			}
		}
		return
	}
	cq := &q.classes[t.cls]
	cq.n--
	cq.work -= t.cost
	f := cq.flows[t.req.flow()]
	heap.Remove(&f.byCost, t.hidx)
	f.work -= t.cost
	f.dead++
	for len(f.arrivals) > 0 && f.arrivals[0].hidx < 0 {
		f.arrivals[0] = nil
		f.arrivals = f.arrivals[1:]
		f.dead--
	}
	if f.dead > len(f.arrivals)/2 {
		keep := f.arrivals[:0]
		for _, x := range f.arrivals {
			if x.hidx >= 0 {
				keep = append(keep, x)
			}
		}
		clear(f.arrivals[len(keep):])
		f.arrivals, f.dead = keep, 0
	}
	if bound {
		cq.v = f.start
		f.start += t.cost / f.weight
	}
	// An idle flow is kept only while its tag is ahead of the class's
	// virtual time: until then it has had more than its share.
	for name, g := range cq.flows {
		if len(g.byCost) == 0 && g.start <= cq.v {
			delete(cq.flows, name)
		}
	}
	if len(f.byCost) == 0 {
		f.work = 0 // no float drift on an empty flow
	}
}

// order is how a queue orders its requests: the aging bound across
// classes, and within a tenant the bound of cheaper-first ordering
// (negative: arrival order).
type order struct {
	overtake, costOvertake time.Duration
}

// head returns the request that goes next, nil when none waits.
func (q *queue) head(o order) *Ticket {
	if len(q.retries) > 0 {
		return q.retries[0]
	}
	return q.next(o)
}

// next returns the first request in order after the retries.
func (q *queue) next(o order) *Ticket {
	var pick *Ticket
	for i := range q.classes {
		cq := &q.classes[i]
		if cq.n == 0 {
			continue
		}
		if pick == nil || pick.enq.Sub(cq.oldest().enq) > o.overtake {
			pick = cq.winner(o.costOvertake)
		}
	}
	return pick
}

// winner is the class's next request: the flow with the lowest start tag
// (ties to the flow whose oldest request came first), then that flow's
// pick.
func (cq *classQueue) winner(maxOvertake time.Duration) *Ticket {
	var best *flow
	for _, f := range cq.flows {
		if len(f.byCost) == 0 {
			continue
		}
		if best == nil || f.start < best.start || (f.start == best.start && f.arrivals[0].seq < best.arrivals[0].seq) {
			best = f
		}
	}
	return best.pick(maxOvertake)
}

// oldest is the class's earliest arrival still waiting.
func (cq *classQueue) oldest() *Ticket {
	var o *Ticket
	for _, f := range cq.flows {
		if len(f.arrivals) > 0 && (o == nil || f.arrivals[0].seq < o.seq) {
			o = f.arrivals[0]
		}
	}
	return o
}

// pick is the flow's next request: the cheapest of those that arrived no
// more than maxOvertake after its oldest, so that no request is passed by
// one that came more than maxOvertake after it.
func (f *flow) pick(maxOvertake time.Duration) *Ticket {
	c, o := f.byCost[0], f.arrivals[0]
	if c.enq.Sub(o.enq) <= maxOvertake {
		return c // the cheapest of all is within the bound: the common case
	}
	best := o
	for _, t := range f.arrivals {
		if t.enq.Sub(o.enq) > maxOvertake {
			break
		}
		if t.hidx >= 0 && f.byCost.Less(t.hidx, best.hidx) {
			best = t
		}
	}
	return best
}

// each calls fn for every waiting request.
func (q *queue) each(fn func(*Ticket)) {
	for _, t := range q.retries {
		fn(t)
	}
	for i := range q.classes {
		for _, f := range q.classes[i].flows {
			for _, t := range f.byCost {
				fn(t)
			}
		}
	}
}

// ahead estimates the work, in tokens, that would be bound before t if it
// joined the queue now: retries and higher classes first, then within its
// class what fair share lets through while t's tenant works off its own
// backlog (the fluid picture of fair queueing: each other tenant gets
// weight/weight(t) as much).
func (q *queue) ahead(t *Ticket, weight float64) float64 {
	w := 0.0
	for _, r := range q.retries {
		w += r.cost
	}
	for i := 0; i < t.cls; i++ {
		w += q.classes[i].work
	}
	cq := &q.classes[t.cls]
	own := 0.0
	if f := cq.flows[t.req.flow()]; f != nil {
		own = f.work
	}
	w += own
	for name, f := range cq.flows {
		if name != t.req.flow() {
			w += min(f.work, own*f.weight/weight)
		}
	}
	return w
}

// costHeap orders a flow's requests by expected cost, then arrival.
type costHeap []*Ticket

func (h costHeap) Len() int { return len(h) }
func (h costHeap) Less(i, j int) bool {
	if h[i].cost != h[j].cost {
		return h[i].cost < h[j].cost
	}
	return h[i].seq < h[j].seq
}
func (h costHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *costHeap) Push(x any) {
	t := x.(*Ticket)
	t.hidx = len(*h)
	*h = append(*h, t)
}
func (h *costHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.hidx = -1
	return t
}
