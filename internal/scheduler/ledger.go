package scheduler

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// Ledger shares reservations with the other replicas that front the same
// fleet, so that they schedule as one (package shared implements it on
// Redis): it adds each worker's in-flight count across replicas to the
// local score, picks and reserves in one atomic step, and keeps a waiting
// list so the oldest queued request of any replica binds first.
//
// Reserve, Wait, Unwait and Release are called outside the scheduler's
// lock (reserver.go); an implementation must bound each call and answer
// ErrLedgerDown at once while down, and the scheduler then uses its local
// share (LocalLimit). The other methods are called under the lock and
// must not block.
type Ledger interface {
	// Reserve picks among cands the lowest Score + ActiveWeight × shared
	// in-flight count of those under Limit, and reserves it. waitID is
	// the request's id on the waiting list, "" if it never queued. It
	// returns ErrLedgerBusy when nothing can be reserved for it now, with
	// the counts it saw (Active, Index -1) when all were full, and
	// ErrLedgerDown when the shared state is unavailable.
	Reserve(model, waitID string, cands []SharedCandidate) (SharedPick, error)
	// Adopt records a reservation made on the local view while down, so
	// the ledger publishes it when it is back; it returns its lease.
	Adopt(worker string) string
	// Release gives a lease back.
	Release(worker, lease string)
	// Wait puts a queued request on the model's shared waiting list.
	Wait(model, waitID string)
	// Unwait takes it off (bound or gone); a no-op if it is not there.
	Unwait(model, waitID string)
	// LocalLimit is this replica's share of a worker with limit slots,
	// used while the shared state is down.
	LocalLimit(limit int) int
	// Replica names this replica in decision records.
	Replica() string
	// Degraded reports whether the shared state is unavailable now.
	Degraded() bool
	// StateAge is how long ago the shared state last answered.
	StateAge() time.Duration
}

// SharedCandidate is one eligible worker as this replica scored it.
type SharedCandidate struct {
	Worker string
	// Score is the total without the active-requests term.
	Score float64
	// ActiveWeight is the active-requests term's weight.
	ActiveWeight float64
	// Limit is the worker's max_concurrency (for all replicas together).
	Limit int
}

// SharedPick is a reservation the Ledger made.
type SharedPick struct {
	// Index is the chosen candidate's index.
	Index int
	// Lease identifies the reservation for Release.
	Lease string
	// Active is each candidate's shared in-flight count before the pick.
	Active []int
}

// Ledger outcomes.
var (
	ErrLedgerBusy = errors.New("scheduler: no shared capacity for this request now")
	ErrLedgerDown = errors.New("scheduler: shared state unavailable")
)

func ticketWaitID(t *Ticket) string { return strconv.FormatUint(t.entry.Seq, 10) }

// activeWeight is the weight of the active-requests term, 0 without one.
func (s *Scheduler) activeWeight() float64 {
	for _, wt := range s.terms {
		if wt.Term.Name() == (activeRequests{}).Name() {
			return signedWeight(wt)
		}
	}
	return 0
}

// newReservation prepares the reservation that replaces the pick's local
// choice: the picker's totals without the active term (of weight aw) go
// to the ledger, and the local choice is held until it answers.
func newReservation(p *pick, pr *pickRecord, aw float64) *reservation {
	cands, tot := p.cands, p.total
	res := &reservation{pr: pr, aw: aw,
		sc:      make([]SharedCandidate, len(cands)),
		elig:    make([]*worker, len(cands)),
		tot:     slices.Clone(tot),
		active:  make([]int, len(cands)),
		slotIdx: make([]int, len(cands))}
	for i := range p.elig {
		v := p.at(i)
		res.sc[i] = SharedCandidate{Worker: cands[i].Name, Score: tot[i] - aw*float64(cands[i].Active), ActiveWeight: aw, Limit: v.lim.limit}
		res.elig[i], res.active[i], res.slotIdx[i] = v.w, cands[i].Active, v.w.order
	}
	if pr != nil {
		pr.pending = true
	}
	return res
}

// setRemoteLocked notes that n requests of other replicas are in flight
// on w, as of this replica's latest answer from the ledger, for the
// concurrency level of w's streams (MeanConcurrency).
func (w *worker) setRemoteLocked(n int, now time.Time) {
	n = max(n, 0)
	if n == w.remote {
		return
	}
	w.busy.move(w.inFlight(), now)
	w.remote = n
}

// The shared waiting list and leases: these ledgerRunner methods are
// no-ops without a Ledger (r nil) and are called under the scheduler's
// lock, which guards the tickets' waiting flags.

// bind hands the ledger's lease (id) to the new Lease and takes a queued
// ticket off the shared waiting list.
func (r *ledgerRunner) bind(t *Ticket, lease *Lease, id string) {
	if r == nil {
		return
	}
	lease.shared = id
	r.gone(t)
}

// queued puts a ticket queued in q on the waiting list, unless no worker
// is known to serve its model yet (q.spec): model names nobody serves come
// from clients and must not reach the shared state. Such tickets join
// when a worker shows it serves the model (join).
func (r *ledgerRunner) queued(t *Ticket, q *queue) {
	if r == nil || !r.waits || t.waiting || (q != nil && q.spec) {
		return
	}
	model, id := t.req.Model, ticketWaitID(t)
	r.calls.Push(model, func() { r.l.Wait(model, id) })
	t.waiting = true
}

// join puts the tickets of q, which stopped being speculative, on the
// waiting list, in the order they came.
func (r *ledgerRunner) join(q *queue) {
	if r == nil {
		return
	}
	ts := slices.Collect(q.All())
	slices.SortFunc(ts, func(a, b *Ticket) int { return cmp.Compare(a.entry.Seq, b.entry.Seq) })
	for _, t := range ts {
		r.queued(t, q)
	}
}

// gone takes a ticket that left the queue (bound or not) off the waiting
// list.
func (r *ledgerRunner) gone(t *Ticket) {
	if r != nil && t.waiting {
		model, id := t.req.Model, ticketWaitID(t)
		r.calls.Push(model, func() { r.l.Unwait(model, id) })
		t.waiting = false
	}
}

// releaseLease gives a lease's shared reservation back, before any
// reservation the release lets this replica's queue ask for.
func (r *ledgerRunner) releaseLease(l *Lease) {
	if r != nil && l.shared != "" {
		r.release(l.model, l.Worker, l.shared)
	}
}

// release gives the ledger's lease on worker back, in model's order.
func (r *ledgerRunner) release(model, worker, lease string) {
	r.calls.Push(model, func() { r.l.Release(worker, lease) })
}

// stampShared marks a record with the replica and the shared state's
// health, as the Ledger (safe for concurrent use) tells them.
func (s *Scheduler) stampShared(rec *decisions.Record) {
	if l := s.cfg.Ledger; l != nil {
		rec.Replica = l.Replica()
		rec.Degraded = l.Degraded()
		rec.SharedStateAgeMs = float64(l.StateAge()) / float64(time.Millisecond)
	}
}
