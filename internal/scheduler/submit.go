package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/fairq"
	"github.com/sluice-router/sluice/internal/predict"
)

// Request is what the scheduler needs to know of a request.
type Request struct {
	// Model is the requested model.
	Model string
	// PromptTokens is the estimated prompt size in tokens.
	PromptTokens int
	// PromptSource says where PromptTokens came from, e.g. "estimate:
	// text/4" or "worker /tokenize"; kept in the decision record.
	PromptSource string
	// MaxTokens is the request's output cap; 0 when unset.
	MaxTokens int
	// Exclude names workers that already failed this request.
	Exclude []string
	// Kinds, when not empty, are the only worker kinds (WorkerSpec.Kind)
	// that may serve the request (filter_kind.go).
	Kinds []string
	// Attempt is 1 for a new request; a retry passes the next number and
	// goes to the front of the queue: it was accepted before the others.
	Attempt int
	// Tenant names who sent the request (from its API key); fair share is
	// kept between tenants. Empty is the anonymous tenant.
	Tenant string
	// Class is the request's priority class (e.g. "interactive",
	// "batch"); empty takes the default class.
	Class string
	// Prefix holds the chained block hashes of the prompt (see package
	// prefix): hash i covers blocks 0..i. Empty when unknown.
	Prefix []uint64
	// KVBlocks holds the chained keys of the prompt's token blocks
	// (kvevents.BlockKeys), when its token ids are known (KVIndex).
	KVBlocks []uint64
	// SLO is the request's own SLO (its API key's, tightened by its
	// headers); unset fields come from its class's, then the default.
	SLO predict.SLO
	// Route is the client route the worker must serve, e.g.
	// "/v1/messages"; empty for routes every engine serves.
	Route string
	// Session identifies the request's conversation or agent session
	// (sessions.go): a digest made by the caller, never the client's raw
	// value, since records name it. SessionSource says where it came from.
	Session       string
	SessionSource string
	// Flow is the request's fair-share flow within its Tenant; empty is
	// the tenant's own flow.
	Flow string
	// BodyBytes is the size of the request's body, which the caller
	// keeps while it waits: counted against Config.MaxQueueBytes.
	BodyBytes int
}

// Submit enters a request into admission. If a worker can take it now the
// returned ticket is already bound; otherwise it waits in the model's queue
// or is refused. notify, if not nil, is called exactly once when the ticket
// ends, outside the scheduler's lock (possibly before Submit returns).
func (s *Scheduler) Submit(req Request, notify func(*Ticket)) *Ticket {
	if req.Attempt == 0 {
		req.Attempt = 1
	}
	now := s.clock.Now()
	t := &Ticket{req: req, notify: notify, done: make(chan struct{})}
	t.entry = fairq.Entry[*Ticket]{Item: t, Arrival: now, Retry: req.Attempt > 1,
		Tenant: req.Tenant, Flow: req.Flow, Bytes: int64(req.BodyBytes)}
	s.update(func() ([]*Ticket, error) {
		s.seq++
		t.entry.Seq = s.seq
		return s.submitLocked(t, now), nil
	})
	return t
}

func (s *Scheduler) submitLocked(t *Ticket, now time.Time) []*Ticket {
	if s.closed {
		s.refuseLocked(t, nil, ErrClosed)
		return []*Ticket{t}
	}
	cls, ok := s.classOf(t.req.Class)
	if !ok {
		rec := s.refusalRecordLocked(t.req, now)
		names := make([]string, len(s.classes))
		for i, c := range s.classes {
			names[i] = c.Name
		}
		s.refuseLocked(t, rec, fmt.Errorf("%w %q (configured: %s)", ErrUnknownClass, t.req.Class, strings.Join(names, ", ")))
		return []*Ticket{t}
	}
	t.entry.Class, t.req.Class = cls, s.classes[cls].Name
	t.entry.Cost = s.expectedCost(nil, t.req)
	q := s.queues[t.req.Model]
	// A new request may only jump the queue when nobody of its model is
	// waiting, nor waiting for the shared ledger's answer.
	mayJump := q == nil || t.entry.Retry || s.cfg.Policy != PolicySluice
	if mayJump && s.reserving[t.req.Model] != nil {
		// It waits only for the ledger's answer to another request of its
		// model, then asks the ledger itself.
		return s.queueLocked(t, now, false)
	}
	if mayJump {
		c := s.pickLocked(t.req, t.entry.Arrival, now, false) // t.entry.Arrival is now
		if c.refuse {
			s.refuseLocked(t, c.rec, ErrSLOUnmeetable)
			return []*Ticket{t}
		}
		if c.w != nil {
			if c.pending != nil {
				s.startReserveLocked(t, c)
				return nil
			}
			s.bindLocked(t, c, "", now)
			return []*Ticket{t}
		} else if s.cfg.Policy != PolicySluice {
			why, _ := s.admissibleLocked(t.req)
			s.refuseLocked(t, s.refusalRecordLocked(t.req, now), cmp.Or(why, ErrNoHealthyWorker))
			return []*Ticket{t}
		}
	}
	return s.queueLocked(t, now, true)
}

// queueLocked puts t in its model's queue, or refuses it when waiting is
// pointless, the queue is full or its deadline cannot be met; then it
// places what can be placed. shared puts it on the shared ledger's
// waiting list too. A ticket already queued stays where it is.
func (s *Scheduler) queueLocked(t *Ticket, now time.Time, shared bool) []*Ticket {
	q := s.queues[t.req.Model]
	if t.queued {
		s.ledger.queued(t, q)
		return nil
	}
	if q != nil {
		t.depth = q.Len()
	}
	why, spec := s.admissibleLocked(t.req)
	var retryAfter time.Duration
	switch {
	case why != nil:
	case t.depth >= s.cfg.MaxQueue && !t.entry.Retry:
		why = ErrQueueFull
	case spec && q == nil && s.queues.speculative() >= s.cfg.MaxQueue:
		// Requests for models nobody is known to serve yet share one
		// budget: client-supplied names must not grow state unbounded.
		why = ErrQueueFull
	case !t.entry.Retry && s.cfg.MaxQueueBytes > 0 && s.queues.bytes()+int64(t.req.BodyBytes) > s.cfg.MaxQueueBytes:
		why = fmt.Errorf("%w (%d MiB)", ErrQueueBytesFull, s.cfg.MaxQueueBytes>>20)
	case !t.entry.Retry:
		// The work that would be bound before it, at the drain rate.
		if wait, ok := s.rates[t.req.Model].TimeFor(s.queues.of(t.req.Model).Ahead(&t.entry, s.weightOf(t.req.Tenant))); ok && wait > deadlineMargin*s.maxWait(t.req.Class) {
			why, retryAfter = ErrDeadlineUnmeetable, wait-s.maxWait(t.req.Class)
		}
	}
	if why != nil {
		rec := s.refusalRecordLocked(t.req, now)
		s.refuseLocked(t, rec, why)
		if retryAfter > 0 {
			t.err.(*Refusal).RetryAfter = clampRetryAfter(retryAfter)
		}
		return []*Ticket{t}
	}
	if q == nil {
		q = &queue{Queue: fairq.New[*Ticket](len(s.classes)), since: now, spec: spec}
		s.queues[t.req.Model] = q
	}
	t.queued = true
	q.Push(&t.entry, s.weightOf(t.req.Tenant))
	if shared {
		s.ledger.queued(t, q)
	}
	// Placing waits behind the queue, but the queue may be held only by
	// retries that excluded the free workers.
	return s.dispatchLocked()
}

// deadlineMargin is how far past its class's deadline a request's
// predicted wait must be before it is refused at once: the prediction is
// noisy and errs long under load.
const deadlineMargin = 2

// Cancel refuses t with cause (ErrQueueTimeout or ErrClientGone) if it is
// still queued, and reports whether it did. When it returns false the
// ticket has ended already; if it was bound, the caller owns the lease.
func (s *Scheduler) Cancel(t *Ticket, cause error) bool {
	now := s.clock.Now()
	return s.update(func() ([]*Ticket, error) {
		if !t.queued && t.res == nil {
			return nil, errEnded
		}
		if t.queued {
			s.queues.unqueue(t, false)
			s.ledger.gone(t)
		}
		rec := s.refusalRecordLocked(t.req, now)
		s.refuseLocked(t, rec, cause)
		// The head may have changed: a retry blocked by its exclusions can
		// have been holding back requests that fit now.
		return append(s.dispatchLocked(), t), nil
	}) == nil
}

// errEnded tells update that Cancel found its ticket ended: nothing changed.
var errEnded = errors.New("the ticket has ended")

// QueueDepth returns how many requests wait for model.
func (s *Scheduler) QueueDepth(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.queues[model]; ok {
		return q.Len()
	}
	return 0
}

// QueueDepths returns how many requests wait for each model: every model a
// worker serves (0 when none wait), and any other with requests waiting.
func (s *Scheduler) QueueDepths() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.queues))
	served(s.workers, func(m string) { out[m] = 0 })
	for m, q := range s.queues {
		out[m] = q.Len()
	}
	return out
}

// QueueDepthsByClass returns, for the models of QueueDepths, how many
// requests wait in each priority class (retries counted in their class).
func (s *Scheduler) QueueDepthsByClass() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]int, len(s.queues))
	zero := func(m string) {
		by := make(map[string]int, len(s.classes))
		for _, c := range s.classes {
			by[c.Name] = 0
		}
		out[m] = by
	}
	served(s.workers, zero)
	for m, q := range s.queues {
		if out[m] == nil {
			zero(m)
		}
		for i, n := range q.ByClass() {
			out[m][s.classes[i].Name] += n
		}
	}
	return out
}
