package scheduler

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/bits"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
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
	f := cq.flows[t.req.Tenant]
	if f == nil {
		f = &flow{weight: weight, start: cq.v}
		cq.flows[t.req.Tenant] = f
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
	f := cq.flows[t.req.Tenant]
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
	if f := cq.flows[t.req.Tenant]; f != nil {
		own = f.work
	}
	w += own
	for name, f := range cq.flows {
		if name != t.req.Tenant {
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

// drainRate measures how fast a model's backlog drains, in tokens per
// second of completed work. It is measured only while requests wait: when
// nobody waits, a release says how busy clients were, not how fast the
// workers are, and an idle hour must not read as a slow worker.
type drainRate struct {
	since  time.Time // start of the current window
	tokens float64   // completed since
	rate   stats.EMA // tokens/s
}

// minDrainWindow is the shortest window a drain-rate sample is taken over,
// so that two releases a moment apart do not read as an infinite rate.
const minDrainWindow = time.Second

// drained accounts tokens completed at now while the backlog that began at
// backlog waits. The first completion of a backlog starts the window
// rather than the backlog itself: the requests in flight when a backlog
// begins are, on average, the long ones, and counting from its start would
// read their remaining time as a slow drain.
func (d *drainRate) drained(tokens float64, backlog, now time.Time) {
	if d.since.Before(backlog) {
		d.since, d.tokens = now, 0 // a new backlog: a fresh window
		return
	}
	d.tokens += tokens
	if dt := now.Sub(d.since); dt >= minDrainWindow {
		d.rate = d.rate.Add(d.tokens/dt.Seconds(), 0.2)
		d.since, d.tokens = now, 0
	}
}

// estimator learns how many tokens requests produce, to estimate the
// output of a request before it runs: an EMA per model, per tenant of the
// model and per prompt-size bucket of the tenant (log2 of the prompt
// tokens). The estimate comes from the most specific level with enough
// samples — bucket, then tenant, then model — else the configured default;
// max_tokens caps it. Keys are served models (a lease exists only for one)
// and tenants, so the estimator does not grow with client input. It is
// guarded by the scheduler's lock.
type estimator struct {
	def    int
	models map[string]*modelEstimate
}

type modelEstimate struct {
	all     stats.EMA
	tenants map[string]*tenantEstimate
}

type tenantEstimate struct {
	all     stats.EMA
	buckets [promptBuckets]stats.EMA
}

const (
	// promptBuckets bounds the prompt-size buckets: 0, 1, 2–3, 4–7, …;
	// the last takes every larger prompt.
	promptBuckets = 24
	// estimateMinSamples is how many samples a bucket or a tenant needs
	// before its average is trusted over the broader one.
	estimateMinSamples = 3
	// estimateAlpha is the smoothing factor of the output averages.
	estimateAlpha = 0.2
)

// Where an output estimate came from, as decision records say it.
const (
	EstimateBucket    = "bucket"     // the tenant's average for prompts of this size
	EstimateTenant    = "tenant"     // the tenant's average for the model
	EstimateModel     = "model"      // the model's average over every tenant
	EstimateDefault   = "default"    // Config.DefaultOutputTokens: nothing learned yet
	EstimateMaxTokens = "max_tokens" // the request's max_tokens, below the estimate
)

func promptBucket(prompt int) int {
	return min(bits.Len(uint(max(prompt, 0))), promptBuckets-1)
}

// estimate returns the expected output tokens of req and their source.
func (e *estimator) estimate(req *Request) (float64, string) {
	out, src := float64(e.def), EstimateDefault
	if m := e.models[req.Model]; m != nil {
		switch t := m.tenants[req.Tenant]; {
		case t != nil && t.buckets[promptBucket(req.PromptTokens)].N >= estimateMinSamples:
			out, src = t.buckets[promptBucket(req.PromptTokens)].Value, EstimateBucket
		case t != nil && t.all.N >= estimateMinSamples:
			out, src = t.all.Value, EstimateTenant
		case m.all.Known():
			out, src = m.all.Value, EstimateModel
		}
	}
	if req.MaxTokens > 0 && float64(req.MaxTokens) < out {
		out, src = float64(req.MaxTokens), EstimateMaxTokens
	}
	return out, src
}

// observe folds in that req produced tokens output tokens.
func (e *estimator) observe(req *Request, tokens int) {
	if e.models == nil {
		e.models = map[string]*modelEstimate{}
	}
	m := e.models[req.Model]
	if m == nil {
		m = &modelEstimate{tenants: map[string]*tenantEstimate{}}
		e.models[req.Model] = m
	}
	t := m.tenants[req.Tenant]
	if t == nil {
		t = &tenantEstimate{}
		m.tenants[req.Tenant] = t
	}
	x := float64(tokens)
	m.all = m.all.Add(x, estimateAlpha)
	t.all = t.all.Add(x, estimateAlpha)
	b := &t.buckets[promptBucket(req.PromptTokens)]
	*b = b.Add(x, estimateAlpha)
}

// classOf returns the index of the request's class in s.classes, the
// default class for an empty name.
func (s *Scheduler) classOf(name string) (int, bool) {
	if name == "" {
		return s.defClass, true
	}
	for i, c := range s.classes {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}

// RequestedClass returns the class a request runs in when its API key
// grants the class granted (empty: the default) and the request asks for
// asked (the X-Sluice-Priority header; empty: no ask). A client may lower
// its priority, never raise it above its key's: an ask for a higher class
// gets the granted one. An unknown ask is returned as is, for admission to
// refuse with ErrUnknownClass.
func (s *Scheduler) RequestedClass(granted, asked string) string {
	if asked == "" {
		return granted
	}
	a, ok := s.classOf(asked)
	if !ok {
		return asked
	}
	if g, ok := s.classOf(granted); ok && s.classes[a].Priority < s.classes[g].Priority {
		return granted
	}
	return asked
}

// maxWait returns the queueing deadline of the named class.
func (s *Scheduler) maxWait(class string) time.Duration {
	if i, ok := s.classOf(class); ok && s.classes[i].MaxQueueWait > 0 {
		return s.classes[i].MaxQueueWait
	}
	return s.cfg.QueueTimeout
}

// weightOf returns a tenant's fair-share weight, 1 unless configured.
func (s *Scheduler) weightOf(tenant string) float64 {
	if w := s.cfg.TenantWeights[tenant]; w > 0 {
		return w
	}
	return 1
}

// checkClasses reports what makes a list of classes unusable.
func checkClasses(cs []Class) error {
	seen := map[string]bool{}
	for i, c := range cs {
		switch {
		case c.Name == "":
			return fmt.Errorf("scheduler: class %d has no name", i)
		case seen[c.Name]:
			return fmt.Errorf("scheduler: class %q listed twice", c.Name)
		case c.MaxQueueWait < 0:
			return fmt.Errorf("scheduler: class %q: negative max_queue_wait %v", c.Name, c.MaxQueueWait)
		}
		seen[c.Name] = true
	}
	return nil
}

// sortClasses returns the classes in priority order, stable for equal
// priorities, and the index of the default (first configured) class.
func sortClasses(cs []Class) ([]Class, int) {
	if len(cs) == 0 {
		cs = DefaultClasses()
	}
	def := cs[0].Name
	out := make([]Class, len(cs))
	copy(out, cs)
	// Insertion sort keeps equal priorities in configuration order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && cmp.Less(out[j].Priority, out[j-1].Priority); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	for i, c := range out {
		if c.Name == def {
			return out, i
		}
	}
	return out, 0
}
