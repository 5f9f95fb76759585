package shared

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// ForScheduler adapts l to scheduler.Ledger. Every call is bounded by
// CallTimeout, so the scheduler, which calls it under its lock, is never
// held up longer by a slow Redis; ctx ends the calls at shutdown.
func (l *Ledger) ForScheduler(ctx context.Context) scheduler.Ledger {
	return schedLedger{l: l, ctx: ctx}
}

type schedLedger struct {
	l   *Ledger
	ctx context.Context
}

func (a schedLedger) Reserve(model, waitID string, cands []scheduler.SharedCandidate) (scheduler.SharedPick, error) {
	cs := make([]Candidate, len(cands))
	for i, c := range cands {
		cs[i] = Candidate{Worker: c.Worker, Score: c.Score, ActiveWeight: c.ActiveWeight, Limit: c.Limit}
	}
	r, err := a.l.Reserve(a.ctx, model, waitID, cs)
	switch {
	case err == nil:
		return scheduler.SharedPick{Index: r.Index, Lease: r.Lease, Active: r.Active}, nil
	case errors.Is(err, ErrDegraded):
		return scheduler.SharedPick{}, scheduler.ErrLedgerDown
	}
	return scheduler.SharedPick{Index: -1, Active: r.Active}, scheduler.ErrLedgerBusy
}

func (a schedLedger) Adopt(worker string) string { return a.l.Adopt(worker).Lease }

func (a schedLedger) Release(worker, lease string) {
	_ = a.l.Release(a.ctx, Reservation{Worker: worker, Lease: lease}) // on failure the lease expires
}

func (a schedLedger) Wait(model, waitID string)   { _ = a.l.Wait(a.ctx, model, waitID) }
func (a schedLedger) Unwait(model, waitID string) { _ = a.l.Unwait(a.ctx, model, waitID) }
func (a schedLedger) LocalLimit(limit int) int    { return a.l.LocalLimit(limit) }
func (a schedLedger) Replica() string             { return a.l.Replica() }
func (a schedLedger) Degraded() bool              { return a.l.Degraded() }
func (a schedLedger) StateAge() time.Duration     { return a.l.StateAge(time.Now()) }
