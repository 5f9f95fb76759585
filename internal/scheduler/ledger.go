package scheduler

import (
	"errors"
	"strconv"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// Ledger shares reservations with the other replicas of a router that
// front the same fleet, so that they schedule as one (package shared
// implements it on Redis). With a Ledger the Sluice policy scores the
// eligible workers as usual but leaves the active-requests term to the
// ledger, which adds each worker's in-flight count across all replicas,
// picks and reserves in one atomic step, and keeps a waiting list so the
// oldest queued request of any replica binds first.
//
// The scheduler calls it under its lock, so an implementation must bound
// every call (a slow ledger counts as down) and answer ErrLedgerDown at
// once while it is down: the scheduler then schedules on its local view
// with its share (LocalLimit) of each worker. Release is called outside
// the lock.
type Ledger interface {
	// Reserve picks among cands the lowest Score + ActiveWeight × shared
	// in-flight count of those under Limit, and reserves it. waitID is
	// the request's id on the waiting list, "" if it never queued. It
	// returns ErrLedgerBusy when nothing can be reserved for it now (all
	// full, or an older request of another replica waits for the model)
	// and ErrLedgerDown when the shared state is unavailable.
	// With ErrLedgerBusy the pick may carry the counts it saw (Active,
	// Index -1), when the ledger read them (all full, not "not your turn").
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

// ledgerState is the scheduler's side of a Ledger, guarded by its mutex.
type ledgerState struct {
	binding bool   // the pick in progress will be bound (not a refusal's record)
	waitID  string // the queued ticket being placed, "" for a new request
	lease   string // the lease of the pick in progress, for bindLocked
}

func ticketWaitID(t *Ticket) string { return strconv.FormatUint(t.seq, 10) }

// pickQueuedLocked picks for a queued ticket, telling the ledger who waits.
func (s *Scheduler) pickQueuedLocked(t *Ticket, now time.Time) (*worker, *decisions.Record) {
	s.shared.waitID = ticketWaitID(t)
	defer func() { s.shared.waitID = "" }()
	return s.pickLocked(t.req, now, false)
}

// activeWeight is the weight of the active-requests term, 0 without one.
func (s *Scheduler) activeWeight() float64 {
	for _, wt := range s.terms {
		if wt.Term.Name() == (activeRequests{}).Name() {
			return signedWeight(wt)
		}
	}
	return 0
}

// reserveSharedLocked replaces scoreLocked's local choice when a Ledger is
// set and the pick will be bound: it sends the totals without the active
// term, adopts the ledger's shared in-flight counts into cands and tot
// (so the record explains the decision that was made) and returns the
// chosen index, or -1 when the request must wait. While the ledger is down
// it picks locally among the workers under this replica's share.
func (s *Scheduler) reserveSharedLocked(rec *decisions.Record, req *Request, cands []Candidate, tot []float64, elig []*worker, key func(int) rankKey) int {
	l := s.cfg.Ledger
	aw := s.activeWeight()
	sc := make([]SharedCandidate, len(cands))
	for i := range cands {
		sc[i] = SharedCandidate{Worker: cands[i].Name, Score: tot[i] - aw*float64(cands[i].Active), ActiveWeight: aw, Limit: elig[i].pickLimit}
	}
	pick, err := l.Reserve(req.Model, s.shared.waitID, sc)
	if rec != nil {
		s.stampSharedLocked(rec) // as of this answer
	}
	switch {
	case err == nil && pick.Index >= 0 && pick.Index < len(cands) && len(pick.Active) == len(cands):
		now := s.clock.Now()
		for i := range cands {
			cands[i].Active = pick.Active[i]
			tot[i] = sc[i].Score + aw*float64(pick.Active[i])
			s.setRemoteLocked(elig[i], pick.Active[i]-elig[i].active, now)
		}
		s.shared.lease = pick.Lease
		return pick.Index
	case errors.Is(err, ErrLedgerBusy) && len(pick.Active) == len(cands):
		// Full: the counts are the fleet at its busiest, the levels its
		// streams run at now.
		now := s.clock.Now()
		for i := range cands {
			s.setRemoteLocked(elig[i], pick.Active[i]-elig[i].active, now)
		}
	case errors.Is(err, ErrLedgerDown):
		// The local view is all there is: levels count this replica's
		// streams only until the ledger answers again.
		now := s.clock.Now()
		for _, w := range s.workers {
			s.setRemoteLocked(w, 0, now)
		}
		best := -1
		for i := range cands {
			if elig[i].active >= l.LocalLimit(sc[i].Limit) {
				continue
			}
			if best < 0 || key(i).less(key(best)) {
				best = i
			}
		}
		if best >= 0 {
			s.shared.lease = l.Adopt(cands[best].Name)
		}
		return best
	}
	return -1
}

// setRemoteLocked notes that n requests of other replicas are in flight
// on w, for the concurrency level of w's streams (MeanConcurrency). The
// count is as of this replica's latest answer from the ledger — a pick,
// or a refusal because every candidate was full — and stays until the
// next: a refusal for another replica's turn carries no counts, and
// releases elsewhere are not pushed.
func (s *Scheduler) setRemoteLocked(w *worker, n int, now time.Time) {
	n = max(n, 0)
	if n == w.remote {
		return
	}
	w.busy.move(w.inFlight(), now)
	w.remote = n
}

// sharedBindLocked hands the pick's lease to the new Lease and takes a
// queued ticket off the shared waiting list.
func (s *Scheduler) sharedBindLocked(t *Ticket, lease *Lease) {
	if s.cfg.Ledger == nil {
		return
	}
	lease.shared, s.shared.lease = s.shared.lease, ""
	if t.queued {
		s.cfg.Ledger.Unwait(t.req.Model, ticketWaitID(t))
	}
}

// sharedQueuedLocked puts a ticket that has just queued on the waiting list.
func (s *Scheduler) sharedQueuedLocked(t *Ticket) {
	if s.cfg.Ledger != nil && s.cfg.Policy == PolicySluice {
		s.cfg.Ledger.Wait(t.req.Model, ticketWaitID(t))
	}
}

// sharedGoneLocked takes a ticket that left the queue unbound off the
// waiting list.
func (s *Scheduler) sharedGoneLocked(t *Ticket) {
	if s.cfg.Ledger != nil {
		s.cfg.Ledger.Unwait(t.req.Model, ticketWaitID(t))
	}
}

// sharedRelease gives a lease's shared reservation back; outside the lock.
func (s *Scheduler) sharedRelease(l *Lease) {
	if s.cfg.Ledger != nil && l.shared != "" {
		s.cfg.Ledger.Release(l.Worker, l.shared)
	}
}

// stampSharedLocked marks a record with the replica and the shared
// state's health.
func (s *Scheduler) stampSharedLocked(rec *decisions.Record) {
	if l := s.cfg.Ledger; l != nil {
		rec.Replica = l.Replica()
		rec.Degraded = l.Degraded()
		rec.SharedStateAgeMs = float64(l.StateAge()) / float64(time.Millisecond)
	}
}
