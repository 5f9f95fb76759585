// Package fairq is one model's queue of waiting requests and its one
// order (order.go): retries first, then classes in priority order bounded
// by an aging rule, then fair share between tenants by token cost and,
// within a tenant, between its flows. It knows nothing of workers: the
// caller asks it who goes next and decides whether that request can be
// placed. Its values are plain; the caller guards them with its own lock.
package fairq

import (
	"cmp"
	"iter"
	"slices"
	"time"
)

// Entry is a request's place in a queue: what the order needs to know of
// it, and the request itself (Item). The caller fills it before Push and
// does not change it while the request waits.
type Entry[T any] struct {
	// Item is the waiting request, what the queue hands back.
	Item T
	// Seq numbers the requests in the order they came; unique.
	Seq uint64
	// Arrival is when the request came: the aging bound is measured
	// between arrivals.
	Arrival time.Time
	// Class is the index of the request's priority class: 0 goes first.
	Class int
	// Cost is the request's expected cost in tokens, what fair share
	// charges its tenant and flow when it is served.
	Cost float64
	// Retry puts the request before every other: it was accepted before
	// everyone waiting.
	Retry bool
	// Tenant names who sent the request; Flow is its fair-share flow
	// within the tenant (a session, or the tenant's own, "").
	Tenant, Flow string
	// Bytes is the size of the request's body, counted in Queue.Bytes.
	Bytes int64

	live bool // a live entry of its flow's arrivals
}

// Queue is one model's waiting requests.
//
// Within a class, tenants share by token cost with start-time fair
// queueing: serving a request of cost c advances its tenant's start tag by
// c/weight. Within a tenant its flows share the tenant's turns the same
// way, each with weight 1, so a tenant gains nothing by splitting its
// requests into more flows. Within a flow requests go in arrival order,
// since output lengths are unknown up front.
type Queue[T any] struct {
	retries []*Entry[T] // in arrival order
	classes []classQueue[T]
	n       int     // requests waiting, retries included
	work    float64 // their expected cost in tokens
	bytes   int64   // their bodies' bytes
}

// classQueue is one class's part of a queue: its tenants and the class's
// virtual time.
type classQueue[T any] struct {
	tenants map[string]*tenantQueue[T]
	v       float64 // start tag of the tenant of this class served last
	n       int
	work    float64
}

// tenantQueue is one tenant's requests of one class: its flows and the
// tenant's virtual time among them.
type tenantQueue[T any] struct {
	weight float64
	start  float64 // start tag of the tenant's next request
	flows  map[string]*flow[T]
	v      float64 // start tag of the tenant's flow served last
	n      int
}

// flow is one flow's requests within its tenant and class, in arrival
// order.
type flow[T any] struct {
	start    float64     // start tag of the flow's next request, within its tenant
	arrivals []*Entry[T] // by arrival; entries no longer live are dead
	dead     int
	n        int // live entries of arrivals
	work     float64
}

// New returns an empty queue for requests of classes priority classes.
func New[T any](classes int) *Queue[T] {
	return &Queue[T]{classes: make([]classQueue[T], classes)}
}

// Len is the number of requests waiting, retries included.
func (q *Queue[T]) Len() int { return q.n }

// Bytes is the sum of the waiting requests' Entry.Bytes.
func (q *Queue[T]) Bytes() int64 { return q.bytes }

// Work is the expected cost, in tokens, of the requests waiting; 0 in no
// queue (q nil).
func (q *Queue[T]) Work() float64 {
	if q == nil {
		return 0
	}
	return q.work
}

// ByClass returns how many requests wait in each class, retries counted
// in theirs.
func (q *Queue[T]) ByClass() []int {
	out := make([]int, len(q.classes))
	for i := range q.classes {
		out[i] = q.classes[i].n
	}
	for _, e := range q.retries {
		out[e.Class]++
	}
	return out
}

// Push adds e to the queue; weight is its tenant's fair-share weight.
func (q *Queue[T]) Push(e *Entry[T], weight float64) {
	q.n++
	q.bytes += e.Bytes
	q.work += e.Cost
	if e.Retry {
		q.retries = append(q.retries, e)
		return
	}
	cq := &q.classes[e.Class]
	cq.n++
	cq.work += e.Cost
	if cq.tenants == nil {
		cq.tenants = map[string]*tenantQueue[T]{}
	}
	tq := cq.tenants[e.Tenant]
	if tq == nil {
		tq = &tenantQueue[T]{weight: weight, start: cq.v, flows: map[string]*flow[T]{}}
		cq.tenants[e.Tenant] = tq
	}
	if tq.n == 0 {
		tq.start = max(tq.start, cq.v) // a tenant idle for a while gets no credit
	}
	tq.n++
	f := tq.flows[e.Flow]
	if f == nil {
		f = &flow[T]{start: tq.v}
		tq.flows[e.Flow] = f
	}
	if f.n == 0 {
		f.start = max(f.start, tq.v) // nor does a flow within its tenant
	}
	f.arrivals = append(f.arrivals, e)
	e.live = true
	f.n++
	f.work += e.Cost
}

// Remove takes e, which waits in q, out of it. When served is set its
// request is being served: its tenant and its flow are charged its cost,
// the class's virtual time moves to the tenant's start tag and the
// tenant's to the flow's.
func (q *Queue[T]) Remove(e *Entry[T], served bool) {
	q.n--
	q.bytes -= e.Bytes
	q.work -= e.Cost
	if e.Retry {
		if i := slices.Index(q.retries, e); i >= 0 {
			q.retries = slices.Delete(q.retries, i, i+1)
		}
		return
	}
	cq := &q.classes[e.Class]
	cq.n--
	cq.work -= e.Cost
	tq := cq.tenants[e.Tenant]
	tq.n--
	f := tq.flows[e.Flow]
	e.live = false
	f.n--
	f.work -= e.Cost
	f.dead++
	f.trim()
	if served {
		cq.v = tq.start
		tq.start += e.Cost / tq.weight
		tq.v = f.start
		f.start += e.Cost
	}
	if f.n == 0 {
		f.work = 0 // no float drift on an empty flow
	}
	// An idle tenant, or flow, is kept only while its tag is ahead of the
	// virtual time it is measured against: until then it has had more than
	// its share.
	for name, g := range tq.flows {
		if g.n == 0 && g.start <= tq.v {
			delete(tq.flows, name)
		}
	}
	for name, g := range cq.tenants {
		if g.n == 0 && g.start <= cq.v {
			delete(cq.tenants, name)
		}
	}
}

// trim drops the dead entries at the front of f's arrivals, so that the
// first is live, and compacts the rest when more than half are dead.
func (f *flow[T]) trim() {
	for len(f.arrivals) > 0 && !f.arrivals[0].live {
		f.arrivals[0] = nil
		f.arrivals = f.arrivals[1:]
		f.dead--
	}
	if f.dead > len(f.arrivals)/2 {
		keep := f.arrivals[:0]
		for _, x := range f.arrivals {
			if x.live {
				keep = append(keep, x)
			}
		}
		clear(f.arrivals[len(keep):])
		f.arrivals, f.dead = keep, 0
	}
}

// Head returns the request that goes next, retries first; the zero T
// when none waits.
func (q *Queue[T]) Head(o Order) T {
	if len(q.retries) > 0 {
		return q.retries[0].Item
	}
	return q.Next(o)
}

// Next returns the first request in order after the retries: the least
// by o of the flows' oldest requests, taken in class order (see
// Order.Less); the zero T when none waits there.
func (q *Queue[T]) Next(o Order) T {
	var pick *Entry[T]
	var pk Key
	for i := range q.classes {
		cq := &q.classes[i]
		if cq.n == 0 {
			continue
		}
		oldest := cq.oldest()
		for _, tq := range cq.tenants {
			if tq.n == 0 {
				continue
			}
			first := tq.oldest()
			for _, f := range tq.flows {
				if f.n == 0 {
					continue
				}
				e := f.arrivals[0] // the first entry is always live
				if k := q.keyIn(e, oldest, first); pick == nil || o.Less(k, pk) {
					pick, pk = e, k
				}
			}
		}
	}
	if pick == nil {
		var none T
		return none
	}
	return pick.Item
}

// oldest is the class's earliest arrival still waiting.
func (cq *classQueue[T]) oldest() *Entry[T] {
	var o *Entry[T]
	for _, tq := range cq.tenants {
		if x := tq.oldest(); x != nil && (o == nil || x.Seq < o.Seq) {
			o = x
		}
	}
	return o
}

// oldest is the tenant's earliest arrival still waiting.
func (tq *tenantQueue[T]) oldest() *Entry[T] {
	var o *Entry[T]
	for _, f := range tq.flows {
		if len(f.arrivals) > 0 && (o == nil || f.arrivals[0].Seq < o.Seq) {
			o = f.arrivals[0]
		}
	}
	return o
}

// eachFlow calls fn for every flow of the class.
func (cq *classQueue[T]) eachFlow(fn func(*flow[T])) {
	for _, tq := range cq.tenants {
		for _, f := range tq.flows {
			fn(f)
		}
	}
}

// Retries are the retries waiting, in the order they joined the queue.
func (q *Queue[T]) Retries() iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, e := range q.retries {
			if !yield(e.Item) {
				return
			}
		}
	}
}

// All are the requests waiting, retries first, the rest in no set order.
func (q *Queue[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, e := range q.retries {
			if !yield(e.Item) {
				return
			}
		}
		for i := range q.classes {
			for _, tq := range q.classes[i].tenants {
				for _, f := range tq.flows {
					for _, e := range f.arrivals {
						if e.live && !yield(e.Item) {
							return
						}
					}
				}
			}
		}
	}
}

// Behind returns the requests waiting behind head in its class that may
// overtake it: arrived after it by no more than bound, in arrival order,
// at most max of them. None are behind a retry.
func (q *Queue[T]) Behind(head *Entry[T], bound time.Duration, max int) []T {
	if head.Retry {
		return nil
	}
	var found []*Entry[T]
	q.classes[head.Class].eachFlow(func(f *flow[T]) {
		n := 0 // a flow's arrivals are in order: its first max will do
		for _, e := range f.arrivals {
			if n == max || e.Arrival.Sub(head.Arrival) > bound {
				break
			}
			if !e.live || e == head || e.Seq < head.Seq {
				continue
			}
			found = append(found, e)
			n++
		}
	})
	slices.SortFunc(found, func(a, b *Entry[T]) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(found) > max {
		found = found[:max]
	}
	out := make([]T, len(found))
	for i, e := range found {
		out[i] = e.Item
	}
	return out
}

// Ahead estimates the work, in tokens, that would be served before e if
// it joined the queue now, its tenant's weight being weight: retries and
// higher classes first, then within its class what fair share lets
// through while e's flow works off its own backlog (the fluid picture of
// fair queueing: each other flow of its tenant gets as much, each other
// tenant weight/weight(e) as much as e's tenant). A tenant's flows share
// its part, so many sessions of one tenant do not put many shares ahead
// of another's request. Nothing is ahead in no queue (q nil).
func (q *Queue[T]) Ahead(e *Entry[T], weight float64) float64 {
	w := 0.0
	if q == nil {
		return w
	}
	for _, r := range q.retries {
		w += r.Cost
	}
	for i := 0; i < e.Class; i++ {
		w += q.classes[i].work
	}
	cq := &q.classes[e.Class]
	own := 0.0 // of e's tenant
	if tq := cq.tenants[e.Tenant]; tq != nil {
		mine := 0.0 // of e's flow
		if f := tq.flows[e.Flow]; f != nil {
			mine = f.work
		}
		own = mine
		for name, f := range tq.flows {
			if name != e.Flow {
				own += min(f.work, mine)
			}
		}
	}
	w += own
	for name, tq := range cq.tenants {
		if name != e.Tenant {
			w += min(tq.work(), own*tq.weight/weight)
		}
	}
	return w
}

// work is the expected cost, in tokens, of the tenant's waiting requests.
func (tq *tenantQueue[T]) work() float64 {
	w := 0.0
	for _, f := range tq.flows {
		w += f.work
	}
	return w
}

// OldestWait is how long the oldest request waiting in q has waited; 0
// when none waits (q nil).
func (q *Queue[T]) OldestWait(now time.Time) time.Duration {
	if q == nil {
		return 0
	}
	var oldest time.Time
	older := func(e *Entry[T]) {
		if e != nil && (oldest.IsZero() || e.Arrival.Before(oldest)) {
			oldest = e.Arrival
		}
	}
	for _, e := range q.retries {
		older(e)
	}
	for i := range q.classes {
		if q.classes[i].n > 0 {
			older(q.classes[i].oldest())
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return now.Sub(oldest)
}
