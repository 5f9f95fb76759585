package scheduler

import "github.com/sluice-router/sluice/internal/clock"

// Clock tells the scheduler the time and wakes it after a delay (package
// clock).
type (
	Clock     = clock.Clock
	Timer     = clock.Timer
	WallClock = clock.Wall
)
