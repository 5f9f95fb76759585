package scheduler

import "time"

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
// Its order is order.go's. Within a class, tenants share by token cost
// with start-time fair queueing: serving a request of cost c advances its
// tenant's start tag by c/weight. Within a tenant its flows (Request.Flow:
// one per session with fair_share_by: session, else the tenant's one)
// share the tenant's turns the same way, each with weight 1, so a tenant
// gains nothing by splitting its requests into more flows. Within a flow
// requests go in arrival order: output lengths are unknown up front, and
// cheapest-first, tried, lengthened the wait of the long prompts it
// passed over (p99).
type queue struct {
	since   time.Time // when this backlog began
	spec    bool      // no worker was known to serve the model when it was created
	retries []*Ticket // in arrival order
	classes []classQueue
	n       int     // requests waiting, retries included
	work    float64 // their expected cost in tokens
	bytes   int64   // their bodies' bytes (Request.BodyBytes)
}

// classQueue is one class's part of a model's queue: its tenants and the
// class's virtual time.
type classQueue struct {
	tenants map[string]*tenantQueue
	v       float64 // start tag of the tenant of this class bound last
	n       int
	work    float64
}

// tenantQueue is one tenant's requests of one class: its flows and the
// tenant's virtual time among them.
type tenantQueue struct {
	weight float64
	start  float64 // start tag of the tenant's next request
	flows  map[string]*flow
	v      float64 // start tag of the tenant's flow bound last
	n      int
}

// flow is one flow's requests within its tenant and class, in arrival
// order.
type flow struct {
	start    float64   // start tag of the flow's next request, within its tenant
	arrivals []*Ticket // by arrival; entries no longer queued are dead
	dead     int
	n        int // live entries of arrivals
	work     float64
}

// queues are the models' queues, by model: only models with requests
// waiting. The scheduler's lock guards them.
type queues map[string]*queue

// unqueue takes a queued ticket out of its model's queue (bound: to be
// served) and deletes the queue when it empties.
func (qs queues) unqueue(t *Ticket, bound bool) {
	q := qs[t.req.Model]
	q.remove(t, bound)
	if q.n == 0 {
		delete(qs, t.req.Model)
	}
}

// speculative counts the requests waiting for models no worker was known
// to serve when they came.
func (qs queues) speculative() int {
	n := 0
	for _, q := range qs {
		if q.spec {
			n += q.n
		}
	}
	return n
}

// bytes is the sum of the bodies' bytes of the requests waiting.
func (qs queues) bytes() int64 {
	var n int64
	for _, q := range qs {
		n += q.bytes
	}
	return n
}

func newQueue(nclasses int, now time.Time) *queue {
	return &queue{since: now, classes: make([]classQueue, nclasses)}
}

// push adds t to the queue.
func (q *queue) push(t *Ticket, weight float64) {
	q.n++
	q.bytes += int64(t.req.BodyBytes)
	q.work += t.cost
	if t.front {
		q.retries = append(q.retries, t)
		return
	}
	cq := &q.classes[t.cls]
	cq.n++
	cq.work += t.cost
	if cq.tenants == nil {
		cq.tenants = map[string]*tenantQueue{}
	}
	tq := cq.tenants[t.req.Tenant]
	if tq == nil {
		tq = &tenantQueue{weight: weight, start: cq.v, flows: map[string]*flow{}}
		cq.tenants[t.req.Tenant] = tq
	}
	if tq.n == 0 {
		tq.start = max(tq.start, cq.v) // a tenant idle for a while gets no credit
	}
	tq.n++
	f := tq.flows[t.req.Flow]
	if f == nil {
		f = &flow{start: tq.v}
		tq.flows[t.req.Flow] = f
	}
	if f.n == 0 {
		f.start = max(f.start, tq.v) // nor does a flow within its tenant
	}
	f.arrivals = append(f.arrivals, t)
	t.inFlow = true
	f.n++
	f.work += t.cost
}

// remove takes t out of the queue. When bound is set t is being served:
// its tenant and its flow are charged its cost, the class's virtual time
// moves to the tenant's start tag and the tenant's to the flow's.
func (q *queue) remove(t *Ticket, bound bool) {
	q.n--
	q.bytes -= int64(t.req.BodyBytes)
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
	tq := cq.tenants[t.req.Tenant]
	tq.n--
	f := tq.flows[t.req.Flow]
	t.inFlow = false
	f.n--
	f.work -= t.cost
	f.dead++
	for len(f.arrivals) > 0 && !f.arrivals[0].inFlow {
		f.arrivals[0] = nil
		f.arrivals = f.arrivals[1:]
		f.dead--
	}
	if f.dead > len(f.arrivals)/2 {
		keep := f.arrivals[:0]
		for _, x := range f.arrivals {
			if x.inFlow {
				keep = append(keep, x)
			}
		}
		clear(f.arrivals[len(keep):])
		f.arrivals, f.dead = keep, 0
	}
	if bound {
		cq.v = tq.start
		tq.start += t.cost / tq.weight
		tq.v = f.start
		f.start += t.cost
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

// workOrZero is the work waiting in q, 0 in no queue (q nil).
func (q *queue) workOrZero() float64 {
	if q == nil {
		return 0
	}
	return q.work
}

// head returns the request that goes next, nil when none waits.
func (q *queue) head(o order) *Ticket {
	if len(q.retries) > 0 {
		return q.retries[0]
	}
	return q.next(o)
}

// next returns the first request in order after the retries: the least
// by o of the flows' oldest requests, taken in class order (see order.less).
func (q *queue) next(o order) *Ticket {
	var pick *Ticket
	var pk key
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
				t := f.arrivals[0] // the first entry is always live
				if k := q.keyIn(t, oldest, first); pick == nil || o.less(k, pk) {
					pick, pk = t, k
				}
			}
		}
	}
	return pick
}

// oldest is the class's earliest arrival still waiting.
func (cq *classQueue) oldest() *Ticket {
	var o *Ticket
	for _, tq := range cq.tenants {
		if x := tq.oldest(); x != nil && (o == nil || x.seq < o.seq) {
			o = x
		}
	}
	return o
}

// oldest is the tenant's earliest arrival still waiting.
func (tq *tenantQueue) oldest() *Ticket {
	var o *Ticket
	for _, f := range tq.flows {
		if len(f.arrivals) > 0 && (o == nil || f.arrivals[0].seq < o.seq) {
			o = f.arrivals[0]
		}
	}
	return o
}

// eachFlow calls fn for every flow of the class.
func (cq *classQueue) eachFlow(fn func(*flow)) {
	for _, tq := range cq.tenants {
		for _, f := range tq.flows {
			fn(f)
		}
	}
}

// each calls fn for every waiting request.
func (q *queue) each(fn func(*Ticket)) {
	for _, t := range q.retries {
		fn(t)
	}
	for i := range q.classes {
		q.classes[i].eachFlow(func(f *flow) {
			for _, t := range f.arrivals {
				if t.inFlow {
					fn(t)
				}
			}
		})
	}
}

// ahead estimates the work, in tokens, that would be bound before t if it
// joined the queue now: retries and higher classes first, then within its
// class what fair share lets through while t's flow works off its own
// backlog (the fluid picture of fair queueing: each other flow of its
// tenant gets as much, each other tenant weight/weight(t) as much as t's
// tenant). Nothing is ahead in no queue (q nil).
func (q *queue) ahead(t *Ticket, weight float64) float64 {
	w := 0.0
	if q == nil {
		return w
	}
	for _, r := range q.retries {
		w += r.cost
	}
	for i := 0; i < t.cls; i++ {
		w += q.classes[i].work
	}
	cq := &q.classes[t.cls]
	own := 0.0 // of t's tenant
	if tq := cq.tenants[t.req.Tenant]; tq != nil {
		mine := 0.0 // of t's flow
		if f := tq.flows[t.req.Flow]; f != nil {
			mine = f.work
		}
		own = mine
		for name, f := range tq.flows {
			if name != t.req.Flow {
				own += min(f.work, mine)
			}
		}
	}
	w += own
	for name, tq := range cq.tenants {
		if name != t.req.Tenant {
			w += min(tq.work(), own*tq.weight/weight)
		}
	}
	return w
}

// work is the expected cost, in tokens, of the tenant's waiting requests.
func (tq *tenantQueue) work() float64 {
	w := 0.0
	for _, f := range tq.flows {
		w += f.work
	}
	return w
}

// oldestWait is how long the oldest request queued in q has waited; 0
// when none waits (q nil).
func (q *queue) oldestWait(now time.Time) time.Duration {
	if q == nil {
		return 0
	}
	var oldest time.Time
	older := func(t *Ticket) {
		if t != nil && (oldest.IsZero() || t.enq.Before(oldest)) {
			oldest = t.enq
		}
	}
	for _, t := range q.retries {
		older(t)
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
