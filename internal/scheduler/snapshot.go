package scheduler

import "github.com/sluice-router/sluice/internal/snapshot"

// A worker's health and telemetry are package snapshot's; the scheduler
// names them too, for the packages that read them through it.
type (
	Health      = snapshot.Health
	Reading     = snapshot.Reading
	Snapshot    = snapshot.Snapshot
	Source      = snapshot.Source
	CacheReport = snapshot.CacheReport
)

// The healths of a worker (snapshot.Health).
const (
	HealthUnknown = snapshot.HealthUnknown
	HealthOK      = snapshot.HealthOK
	HealthLoading = snapshot.HealthLoading
	HealthDown    = snapshot.HealthDown
)
