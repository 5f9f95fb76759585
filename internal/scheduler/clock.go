package scheduler

import "github.com/sluice-router/sluice/internal/clock"

// Clock tells the scheduler what time it is and wakes it after a delay
// (package clock): the HTTP router uses the wall clock, tests and the
// virtual-time simulation their own.
type (
	Clock     = clock.Clock
	Timer     = clock.Timer
	WallClock = clock.Wall
)
