// Package compare runs `sluice bench compare`: Sluice and baseline
// policies against the same fleet, the same requests and the same seed,
// at several loads and in a burst, and writes a report per load and a
// summary that judges the goals of docs/benchmarks.md.
//
// A comparison runs in virtual time (internal/vsim), over real HTTP on
// loopback against a simulated fleet, or against running llama.cpp
// workers on the wall clock. Beside the per-load tables the summary can
// hold each policy's goodput under the SLO (Options.Goodput), the idle
// floor no router can beat (Options.IdleFloor), a row of Sluice replicas
// sharing the fleet through Redis (Options.Replicas), a row with the
// engines' KV-cache events (Options.KVEvents), and how Sluice's ratios to
// least-connections' spread over several seeds (Options.Seeds). On a
// fleet whose file gives a card slowdowns (a throttle, a noisy
// neighbour), the summary also says where each policy sent its requests
// before, during and after each slowdown, how soon it turned away from
// the card and came back, its p99 time to first token while the card
// was slow, and, in virtual time, which of Sluice's score terms moved
// against the card (slowdown.go).
//
// # Concurrency Model
//
// Run is sequential: one scenario and one policy at a time. Each run
// builds its own router and, on a simulated fleet, its own fleet, so runs
// share nothing but the private redis-server a replicas comparison starts
// once for all its runs (each run's keys under a prefix of its own) and,
// with Options.Workers, the running workers themselves.
package compare
