// Package clocktest is a clock.Clock for tests: it moves only when told
// to.
package clocktest

import (
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/clock"
)

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
func (c *ManualClock) NewTimer(d time.Duration) clock.Timer {
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
