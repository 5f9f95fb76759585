package scheduler

import (
	"sync"
	"time"
)

// Clock tells the scheduler what time it is and wakes it after a delay.
// The HTTP router uses the wall clock; tests and the virtual-time
// simulation pass their own, so the same scheduling code runs in all of
// them without sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once, d after now.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	// C delivers the time once the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// WallClock is the Clock of the real world.
type WallClock struct{}

// Now returns time.Now().
func (WallClock) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (WallClock) NewTimer(d time.Duration) Timer { return wallTimer{time.NewTimer(d)} }

type wallTimer struct{ t *time.Timer }

func (w wallTimer) C() <-chan time.Time { return w.t.C }
func (w wallTimer) Stop() bool          { return w.t.Stop() }

// ManualClock is a Clock that moves only when told to: tests drive time
// with Advance and its timers fire exactly when their deadline is passed.
// It is safe for concurrent use.
type ManualClock struct {
	mu     sync.Mutex
	armed  sync.Cond // signalled when a timer is armed
	now    time.Time
	timers []*manualTimer
}

// NewManualClock returns a ManualClock showing start.
func NewManualClock(start time.Time) *ManualClock {
	c := &ManualClock{now: start}
	c.armed.L = &c.mu
	return c
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (forwards or backwards) without firing timers
// it jumps over backwards; timers whose deadline is at or before t fire.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	due := c.dueLocked()
	c.mu.Unlock()
	for _, tm := range due {
		tm.ch <- tm.at
	}
}

// Advance moves the clock forward by d and fires the timers that fall due.
func (c *ManualClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// NewTimer returns a timer that fires when the clock reaches now+d.
func (c *ManualClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	tm := &manualTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, tm)
	c.armed.Broadcast()
	due := c.dueLocked()
	c.mu.Unlock()
	for _, t := range due {
		t.ch <- t.at
	}
	return tm
}

// AwaitTimers blocks until at least n timers are waiting, so a test can
// let the code under test arm its timer before advancing the clock.
func (c *ManualClock) AwaitTimers(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.timers) < n {
		c.armed.Wait()
	}
}

func (c *ManualClock) dueLocked() []*manualTimer {
	var due []*manualTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
		} else {
			keep = append(keep, t)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
	return due
}

type manualTimer struct {
	c  *ManualClock
	at time.Time
	ch chan time.Time
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}
