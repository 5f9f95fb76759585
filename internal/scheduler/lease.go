package scheduler

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/drain"
	"github.com/sluice-router/sluice/internal/fairq"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/outlen"
	"github.com/sluice-router/sluice/internal/predict"
)

// Ticket is one request's place in admission. See the package doc.
type Ticket struct {
	req Request
	// entry is its place in its model's queue.
	entry  fairq.Entry[*Ticket]
	depth  int
	notify func(*Ticket)
	done   chan struct{}

	// res is the reservation the ledger is making for it, if any;
	// waiting says it is on the shared ledger's waiting list.
	res     *reservation
	waiting bool

	// Set once, under the scheduler's lock, before done is closed.
	lease  *Lease
	err    error
	rec    *decisions.Record
	queued bool
}

// Done reports whether the ticket has ended (bound or refused).
func (t *Ticket) Done() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Wait returns a channel closed when the ticket ends.
func (t *Ticket) Wait() <-chan struct{} { return t.done }

// Result returns the lease or the refusal; valid once Done.
func (t *Ticket) Result() (*Lease, error) { return t.lease, t.err }

// Lease is a reservation of one slot on a worker. Release gives it back;
// Complete, for an answer relayed in full, files its measurements first.
type Lease struct {
	s        *Scheduler
	w        *worker
	cost     float64
	model    string
	shared   string // the Ledger's lease, "" without one
	req      Request
	released atomic.Bool

	// Worker is the chosen worker's name.
	Worker string
	// Limit is the worker's concurrency limit when the lease was made
	// (its decision record says why).
	Limit      int
	bound      time.Time // when the lease was made
	busyAtBind float64   // the worker's busy integral then
	// Decision is the record of the decision that made this lease.
	Decision *decisions.Record
	// QueueWait is how long the request waited for the lease.
	QueueWait time.Duration
	// Prediction is what the request was predicted to get on the worker
	// (nil without a Predictor, or when the shared ledger chose); found is
	// what it found there when bound, for the predictor (Complete).
	Prediction *predict.Prediction
	found      predict.Input
	// load is the LoRA adapter load the request waits for before it is
	// sent (nil: none).
	load *lora.Load
}

// Release gives the slot back and places the next queued request. Calling
// it more than once, or after Complete, has no further effect.
func (l *Lease) Release() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	s := l.s
	s.update(func() ([]*Ticket, error) { return s.endLocked(l, 0, s.clock.Now()), nil })
}

// endLocked gives l's slot back and places the queued requests that can
// now go. outputTokens, when positive, is what the answer produced, for
// the output estimate and the drain rate. The caller has won l.released
// and holds s.mu.
func (s *Scheduler) endLocked(l *Lease, outputTokens int, now time.Time) []*Ticket {
	if outputTokens > 0 {
		s.est.Observe(outOf(&l.req), outputTokens)
	}
	// The shared slot first: the dispatch below asks the ledger, which
	// must already count it free.
	s.ledger.releaseLease(l)
	s.kvDoneLocked(l)
	l.unbindAdapter()
	l.w.take(-1, -l.cost, now)
	s.retireLocked(l.w)
	if q := s.queues[l.model]; q != nil {
		// A backlog drains at the tokens produced when known, else at
		// what they were expected to cost; an idle spell says nothing.
		d := s.rates[l.model]
		if d == nil {
			d = &drain.Rate{}
			s.rates[l.model] = d
		}
		work := l.cost
		if outputTokens > 0 {
			work = float64(l.req.PromptTokens + outputTokens)
		}
		d.Drained(work, q.since, now)
	}
	done := s.dispatchLocked()
	s.changed.notify()
	return done
}

// outOf is what the output estimate of req is keyed by.
func outOf(req *Request) outlen.Request {
	return outlen.Request{Model: req.Model, Tenant: req.Tenant, PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens}
}

// expectedCost estimates the tokens a request will keep a worker busy
// with: its prompt plus its expected output, capped by max_tokens. On a
// worker with measured history (w not nil), its mean output stands in for
// the estimate; w is nil for the queue's order and deadlines.
func (s *Scheduler) expectedCost(w *worker, req Request) float64 {
	out, _ := s.est.Estimate(outOf(&req))
	if w != nil && s.cfg.Stats != nil {
		if st := s.cfg.Stats.Stats(w.spec.Name); st != nil && st.OutputTokens.Known() {
			out = st.OutputTokens.Value
			if req.MaxTokens > 0 {
				out = math.Min(out, float64(req.MaxTokens))
			}
		}
	}
	return float64(req.PromptTokens) + out
}

// ExpectedCachedTokens is how many of the request's prompt tokens the
// chosen worker was expected to hold in its prefix cache; 0 without a
// Predictor or for the baselines.
func (l *Lease) ExpectedCachedTokens() int { return l.found.CachedTokens }

// bindLocked binds t to c's worker: the slot is reserved, the lease made
// (sharedID: the ledger's lease, "" without one) and the record completed.
func (s *Scheduler) bindLocked(t *Ticket, c choice, sharedID string, now time.Time) {
	w, rec := c.w, c.rec
	cost := s.expectedCost(w, t.req)
	w.take(1, cost, now)
	s.picks++
	w.lastPick = s.picks
	wait := now.Sub(t.entry.Arrival)
	if rec != nil {
		rec.Outcome, rec.QueueWaitMs, rec.QueueDepth = "bound", float64(wait)/float64(time.Millisecond), t.depth
	}
	s.recordPrefixLocked(t.req, w)
	t.lease = &Lease{s: s, w: w, cost: cost, model: t.req.Model, req: t.req, Worker: w.spec.Name, Decision: rec, QueueWait: wait,
		Limit: c.limit, bound: now, busyAtBind: w.busy.integral, Prediction: c.pred, found: c.found}
	if state := w.bindAdapter(t.lease, s.adapterOf(t.req.Model)); state != "" && rec != nil && rec.Adapter != nil {
		rec.Adapter.State = state
	}
	s.ledger.bind(t, t.lease, sharedID)
	s.kvSendLocked(t.lease)
	t.rec = rec
	t.queued = false
}

// refuseLocked ends t with a Refusal for cause, completing rec (nil: a
// record of the request alone, when records are on).
func (s *Scheduler) refuseLocked(t *Ticket, rec *decisions.Record, cause error) {
	if rec == nil && !s.cfg.NoRecords {
		rec = new(decisions.Record)
		out, src := s.est.Estimate(outOf(&t.req))
		s.fillRecord(rec, &t.req, s.clock.Now(), out, src)
	}
	if t.res != nil {
		t.res.gone = true // the ledger's answer gives back what it reserved
		t.res = nil
	}
	wait := s.clock.Now().Sub(t.entry.Arrival)
	// Retry-After: the work queued for its model plus its own at the
	// drain rate; else the queue timeout.
	retry, ok := s.rates[t.req.Model].TimeFor(t.entry.Cost + s.queues.of(t.req.Model).Work())
	if !ok {
		retry = s.cfg.QueueTimeout
	}
	ref := &Refusal{Err: cause, Reason: reasonOf(cause), RetryAfter: clampRetryAfter(retry), QueueWait: wait}
	if rec != nil {
		// The record's pick chose nobody: it reserved nothing.
		rec.Chosen, rec.Outcome, rec.Reason = "", ref.Reason, cause.Error()
		rec.QueueWaitMs, rec.QueueDepth = float64(wait)/float64(time.Millisecond), t.depth
		ref.DecisionID = rec.ID
	}
	t.rec = rec
	t.err = ref
	t.queued = false
}

// clampRetryAfter keeps a Retry-After between a second and ten minutes.
func clampRetryAfter(d time.Duration) time.Duration {
	return min(max(d, time.Second), 10*time.Minute)
}
