package scheduler

import "time"

// Borrow steps. Workers may borrow over their learned limit once a
// model's oldest queued request has waited limit.Config.BorrowAfter, with
// nothing else happening, so something must place the queue again then.
// One goroutine per model with requests waiting in Admit does it: a timer
// due when the oldest will have waited another BorrowAfter, which Kicks.

// borrowStep is one model's step; its fields are under the scheduler's
// lock.
type borrowStep struct {
	waiters int           // Admit calls waiting for the model
	due     time.Time     // when the timer armed fires
	wake    chan struct{} // a waiter left: the due time may have moved
	stop    chan struct{} // closed when the last waiter left
}

// stepWhileWaiting counts a queued request of model waiting in Admit,
// starting the model's step for the first, and returns what to call when
// it stops waiting.
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
