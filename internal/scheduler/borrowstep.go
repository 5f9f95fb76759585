package scheduler

import "time"

// Borrow steps.
//
// Workers may borrow over their learned limit once a model's oldest
// queued request has waited limit.Config.BorrowAfter, and
// nothing else need happen meanwhile, so something must place the queue
// again when that wait crosses each BorrowAfter. One step per model does
// it for all its waiters: a goroutine with one timer, due when the oldest
// request waiting for the model will have waited another BorrowAfter,
// which sweeps and dispatches (Kick) when it fires. It runs while Admit
// has requests of the model waiting, and is armed again when one of them
// leaves, since the oldest may be the one that left.

// borrowStep is one model's step; its fields are under the scheduler's
// lock.
type borrowStep struct {
	waiters int           // Admit calls waiting for the model
	due     time.Time     // when the timer armed fires
	wake    chan struct{} // a waiter left: the due time may have moved
	stop    chan struct{} // closed when the last waiter left
}

// stepWhileWaiting counts a request of model waiting in Admit, starting
// the model's step for the first, and returns what to call when it stops
// waiting. The request must already be queued.
func (s *Scheduler) stepWhileWaiting(model string) (leave func()) {
	s.mu.Lock()
	st := s.steps[model]
	if st == nil {
		if s.steps == nil {
			s.steps = map[string]*borrowStep{}
		}
		st = &borrowStep{wake: make(chan struct{}, 1), stop: make(chan struct{})}
		s.steps[model] = st
		go s.runStep(model, st)
	}
	st.waiters++
	s.mu.Unlock()
	return func() {
		now := s.clock.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		st.waiters--
		if st.waiters == 0 {
			delete(s.steps, model)
			close(st.stop)
			return
		}
		if !now.Add(s.limits.StepIn(s.queues.of(model).OldestWait(now))).Equal(st.due) {
			select {
			case st.wake <- struct{}{}:
			default: // already woken
			}
		}
	}
}

// runStep is model's step: it places the queue each time the model's
// oldest waiting request has waited another BorrowAfter, until st stops.
func (s *Scheduler) runStep(model string, st *borrowStep) {
	for {
		select {
		case <-st.wake: // the due time computed below sees who left
		default:
		}
		now := s.clock.Now()
		s.mu.Lock()
		d := s.limits.StepIn(s.queues.of(model).OldestWait(now))
		st.due = now.Add(d)
		s.mu.Unlock()
		t := s.clock.NewTimer(d)
		select {
		case <-st.stop:
			t.Stop()
			return
		case <-st.wake:
			t.Stop()
		case <-t.C():
			s.Kick()
		}
	}
}
