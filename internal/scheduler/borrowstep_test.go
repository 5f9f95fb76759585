package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/limit"
)

// countingClock is a ManualClock that counts the timers armed on it.
type countingClock struct {
	*clocktest.ManualClock
	armed atomic.Int64
}

func (c *countingClock) NewTimer(d time.Duration) Timer {
	c.armed.Add(1)
	return c.ManualClock.NewTimer(d)
}

// Requests waiting for one model share one borrow step: each BorrowAfter
// one timer is armed and one sweep made for the model, however many wait.
func TestAdmit_OneBorrowStepPerModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &countingClock{ManualClock: clocktest.NewManualClock(time.Unix(10000, 0))}
		s := newSched(t, Config{MaxQueue: 64, QueueTimeout: time.Minute, Clock: clk,
			Limits: limit.Config{MinSamples: 3, BorrowAfter: 2 * time.Second}},
			WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 1}) // at its cap: nobody borrows
		held, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const waiters = 16
		errs := make(chan error, waiters)
		for range waiters {
			go func() {
				_, err := s.Admit(ctx, Request{Model: "m"})
				errs <- err
			}()
		}
		synctest.Wait()
		if got, want := clk.armed.Load(), int64(waiters+1); got != want {
			t.Errorf("%d timers armed by %d waiters, want %d: a queue timeout each and the model's step", got, waiters, want)
		}
		for step := 1; step <= 3; step++ {
			before := clk.armed.Load()
			clk.Advance(2 * time.Second)
			synctest.Wait()
			if got, want := clk.armed.Load()-before, int64(1); got != want {
				t.Errorf("step %d: %d timers armed again (a sweep each), want %d", step, got, want)
			}
		}
		cancel()
		for range waiters {
			if err := <-errs; !errors.Is(err, ErrClientGone) {
				t.Errorf("waiter: %v, want client gone", err)
			}
		}
	})
}

// When the oldest waiter leaves, the step follows the one now oldest:
// its wait, not the one that left, says when workers may borrow again.
func TestAdmit_BorrowStepFollowsTheOldestWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clocktest.NewManualClock(time.Unix(10000, 0))
		t0 := clk.Now()
		at := func(d time.Duration) {
			t.Helper()
			clk.Set(t0.Add(d))
			synctest.Wait()
		}
		fs := fakeStats{"w": learnedOne(t0)}
		s := newSched(t, Config{MaxQueue: 5, QueueTimeout: time.Minute, Stats: fs, Clock: clk,
			Limits: limit.Config{MinStreamTokS: 50, MinSamples: 3, BorrowAfter: 2 * time.Second}},
			WorkerSpec{Name: "w", Models: []string{"m"}, MaxConcurrency: 4})
		admit := func(ctx context.Context) <-chan *Lease {
			got := make(chan *Lease, 1)
			go func() {
				l, _ := s.Admit(ctx, Request{Model: "m"})
				got <- l
			}()
			synctest.Wait()
			return got
		}
		held, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		borrowing := admit(context.Background())
		at(2 * time.Second) // bound over the learned limit: two in flight
		over := <-borrowing
		defer over.Release()

		ctxA, cancelA := context.WithCancel(context.Background())
		gotA := admit(ctxA) // waits from 2s; at 4s borrowing one more finds two in flight
		at(3 * time.Second)
		gotB := admit(context.Background()) // waits from 3s; the step is due at 6s for the first
		at(4200 * time.Millisecond)
		cancelA() // the second is the oldest now: due at 5s
		if l := <-gotA; l != nil {
			t.Fatalf("the waiter that left was bound: %+v", l)
		}
		synctest.Wait()
		at(4500 * time.Millisecond)
		held.Release() // one in flight; the oldest waiter waited 1.5s: limit 1
		synctest.Wait()
		at(4999 * time.Millisecond)
		select {
		case l := <-gotB:
			t.Fatalf("bound before borrowing was due: %+v", l)
		default:
		}
		at(5 * time.Second) // the oldest waiter has waited 2s
		var l *Lease
		select {
		case l = <-gotB:
		default:
			t.Fatal("not bound once the oldest waiter had waited BorrowAfter")
		}
		defer l.Release()
		if got, want := l.Limit, 2; got != want {
			t.Fatalf("bound at limit %d, want %d (learned 1, borrowing 1)", got, want)
		}
	})
}
