package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Admit blocks until req is bound to a worker, and returns the lease, or
// until it is refused (queue full, deadline passed or unmeetable, ctx
// ended, no worker could ever take it): a *Refusal wrapping one of the
// package's sentinel errors. A LoRA adapter to load is loaded
// (Lease.Ready) before it returns; a failed load places the request again
// on another worker, or refuses it with ErrAdapterLoad.
func (s *Scheduler) Admit(ctx context.Context, req Request) (*Lease, error) {
	var loadErr error
	for {
		l, err := s.admit(ctx, req)
		if err != nil {
			if loadErr != nil && (errors.Is(err, ErrNoHealthyWorker) || errors.Is(err, ErrUnknownModel)) {
				return nil, &Refusal{Err: fmt.Errorf("%w: %w", ErrAdapterLoad, loadErr), Reason: reasonOf(ErrAdapterLoad)}
			}
			return nil, err
		}
		if loadErr = l.Ready(ctx); loadErr == nil {
			return l, nil
		}
		l.Release()
		if ctx.Err() != nil {
			return nil, &Refusal{Err: ErrClientGone, Reason: reasonOf(ErrClientGone)}
		}
		req.Exclude = append(slices.Clip(req.Exclude), l.Worker)
	}
}

func (s *Scheduler) admit(ctx context.Context, req Request) (*Lease, error) {
	t := s.Submit(req, nil)
	if t.Done() {
		return t.Result()
	}
	timer := s.clock.NewTimer(s.maxWait(req.Class))
	defer timer.Stop()
	// Borrowing over learned limits needs a placement when the wait
	// crosses BorrowAfter (borrowstep.go).
	if s.cfg.Policy == PolicySluice && !s.limits.Fixed {
		defer s.stepWhileWaiting(req.Model)()
	}
	var cause error
	select {
	case <-t.done:
		return t.Result()
	case <-ctx.Done():
		cause = ErrClientGone
	case <-timer.C():
		cause = ErrQueueTimeout
	}
	if s.Cancel(t, cause) {
		return t.Result()
	}
	// Bound at the same moment we gave up.
	<-t.done
	l, err := t.Result()
	if err == nil && errors.Is(cause, ErrClientGone) {
		l.Release()
		return nil, t.refusalAfterBind(cause)
	}
	return l, err
}

// refusalAfterBind builds the refusal for a ticket that was bound just as
// its client went away (the lease has been released).
func (t *Ticket) refusalAfterBind(cause error) error {
	ref := &Refusal{Err: cause, Reason: reasonOf(cause), QueueWait: t.lease.QueueWait}
	if t.rec != nil {
		ref.DecisionID = t.rec.ID
	}
	return ref
}
