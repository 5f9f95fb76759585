package scheduler

import "github.com/sluice-router/sluice/internal/snapshot"

// A worker's health and telemetry are package snapshot's; every other
// package names them there, the scheduler's files by these names.
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
