package scheduler

import (
	"errors"
	"time"

	"github.com/sluice-router/sluice/internal/serial"
)

// The shared ledger's calls are network round trips, so none runs under
// the scheduler's lock: each is queued, under the lock, on the request's
// model and made in that order by a goroutine of the model's own, so a
// request is on the shared waiting list before it asks for a slot and off
// it only after.
//
// A reservation is such a call whose answer the scheduler waits for
// without blocking anyone: the asking pick holds its locally best worker
// tentatively (in-flight +1), so local picks meanwhile see it, and marks
// the model as reserving, so no other request of the model overtakes it.
// The answer, handled under the lock (settleReserve), gives the hold back
// and binds, queues, or falls back to the local view; a request refused
// meanwhile gives the ledger's lease back.

// ledgerRunner makes a Ledger's calls outside the scheduler's lock, in
// order per model (package serial).
type ledgerRunner struct {
	l Ledger
	// waits says the policy is Sluice's, whose queued requests go on
	// the shared waiting list.
	waits bool
	calls serial.Runner
}

func newLedgerRunner(s *Scheduler, l Ledger) *ledgerRunner {
	return &ledgerRunner{l: l, waits: s.cfg.Policy == PolicySluice}
}

// wait returns when every call queued so far has been made, and every
// call those calls' answers queued.
func (r *ledgerRunner) wait() { r.calls.Wait() }

// reservation is a pick waiting for the ledger's answer.
type reservation struct {
	t        *Ticket
	hold     *worker // the tentative hold: the locally best worker
	holdCost float64
	pr       *pickRecord // nil without records
	sc       []SharedCandidate
	elig     []*worker
	tot      []float64 // the local totals, with the active term
	active   []int     // the local in-flight counts, as scored
	slotIdx  []int     // the candidates' configuration indexes
	aw       float64   // the active term's weight
	// missed says that a placement skipped the model meanwhile: when the
	// ledger has no room for this one, the model's queue is tried again.
	missed bool
	// gone says that the ticket ended meanwhile (refused): the answer
	// gives back whatever the ledger reserved.
	gone bool
}

// startReserveLocked asks the ledger to reserve a worker for t as the
// pick c scored them, holding c's worker until it answers.
func (s *Scheduler) startReserveLocked(t *Ticket, c choice) {
	res, w, rec := c.pending, c.w, c.rec
	res.t, res.hold = t, w
	res.holdCost = s.expectedCost(w, t.req)
	w.take(1, res.holdCost, s.clock.Now())
	t.res = res
	t.rec = rec
	s.reserving[t.req.Model] = res
	waitID := ""
	if t.waiting {
		waitID = ticketWaitID(t)
	}
	model := t.req.Model
	s.ledger.calls.Push(model, func() {
		pick, err := s.ledger.l.Reserve(model, waitID, res.sc)
		s.reserved(res, pick, err)
	})
}

// reserved handles the ledger's answer to res (see the top of this
// file): it gives the hold back and binds, queues or falls back.
func (s *Scheduler) reserved(res *reservation, pick SharedPick, err error) {
	s.update(func() ([]*Ticket, error) {
		t := res.t
		model := t.req.Model
		now := s.clock.Now()
		res.hold.take(-1, -res.holdCost, now)
		s.retireLocked(res.hold)
		delete(s.reserving, model)
		t.res = nil
		var done []*Ticket
		ok := err == nil && pick.Index >= 0 && pick.Index < len(res.sc) && len(pick.Active) == len(res.sc)
		switch {
		case res.gone:
			if ok {
				s.ledger.release(model, res.sc[pick.Index].Worker, pick.Lease)
			}
		case ok && !res.elig[pick.Index].removed && !res.elig[pick.Index].draining:
			for i, e := range res.elig {
				res.tot[i] = res.sc[i].Score + res.aw*float64(pick.Active[i])
				e.setRemoteLocked(pick.Active[i]-e.active, now)
			}
			s.bindReservedLocked(res, pick.Index, pick.Lease, pick.Active, now)
			done = append(done, t)
		case ok: // the worker it chose left meanwhile
			s.ledger.release(model, res.sc[pick.Index].Worker, pick.Lease)
			done = s.queueLocked(t, now, true)
		case errors.Is(err, ErrLedgerDown):
			// The local view is all there is: levels count this replica's
			// streams only until the ledger answers again.
			for _, e := range s.workers {
				e.setRemoteLocked(0, now)
			}
			best := -1
			for i, e := range res.elig {
				if e.removed || e.draining || e.active >= s.ledger.l.LocalLimit(res.sc[i].Limit) {
					continue
				}
				if best < 0 || (rankKey{res.tot[i], e.lastPick, e.order}).less(rankKey{res.tot[best], res.elig[best].lastPick, res.elig[best].order}) {
					best = i
				}
			}
			if best >= 0 {
				s.bindReservedLocked(res, best, s.ledger.l.Adopt(res.sc[best].Worker), res.active, now)
				done = append(done, t)
			} else {
				done = s.queueLocked(t, now, true)
			}
		default:
			if errors.Is(err, ErrLedgerBusy) && len(pick.Active) == len(res.sc) {
				// Full: the counts are the fleet at its busiest, the levels
				// its streams run at now.
				for i, e := range res.elig {
					e.setRemoteLocked(pick.Active[i]-e.active, now)
				}
			}
			done = s.queueLocked(t, now, true)
			if !res.missed {
				// Nothing freed meanwhile: the model waits for the next
				// release or wake-up, not for another round trip now.
				return append(done, s.dispatchExceptLocked(model, true)...), nil
			}
		}
		return append(done, s.dispatchLocked()...), nil
	})
}

// bindReservedLocked binds res's ticket to its candidate i with the
// ledger's lease, and fills in the pick's record as the ledger made it.
func (s *Scheduler) bindReservedLocked(res *reservation, i int, lease string, active []int, now time.Time) {
	t := res.t
	w := res.elig[i]
	if pr := res.pr; pr != nil {
		pr.patchShared(s, res, i, active)
	}
	if t.queued {
		s.queues.unqueue(t, true)
	}
	s.bindLocked(t, choice{w: w, limit: res.sc[i].Limit, rec: t.rec}, lease, now)
}

// patchShared rewrites the record of a reserved pick with the ledger's
// answer: each candidate's in-flight count as scored, its total, and the
// choice (candidate i).
func (pr *pickRecord) patchShared(s *Scheduler, res *reservation, i int, active []int) {
	if len(pr.total) < len(res.slotIdx) {
		pr.total = make([]float64, len(res.slotIdx))
	}
	for j, at := range res.slotIdx {
		pr.total[j], pr.slots[at].scored = res.tot[j], int32(active[j])
		res.elig[j].last, res.elig[j].lastIdx = &pr.rec, at
	}
	pr.scored, pr.shared, pr.pending = true, true, false
	pr.chosen = res.slotIdx[i]
	pr.rec.Chosen = res.elig[i].spec.Name
	pr.rec.Summary.Score = res.tot[i]
	s.stampShared(&pr.rec)
}

// FlushLedger returns when every call to the shared ledger queued so far,
// and every call their answers queued, has been made. Without a Ledger it
// returns at once.
func (s *Scheduler) FlushLedger() {
	if s.ledger != nil {
		s.ledger.wait()
	}
}
