// Package vsim is Sluice's virtual-time simulation: the real scheduler
// (scheduler.New, with a virtual Clock) in front of simulated GPU workers
// (sim.Engine), driven by a discrete-event loop instead of HTTP, goroutines
// and sleeping. A day of traffic over a thousand workers runs in seconds,
// and the same Config and load always give the same results, so an
// operator can ask "what would have happened with these weights, limits or
// this policy?" (Run, Replay) and "how many cards do I need?" (Plan).
//
// Run returns []bench.Result in the shape of the HTTP load generator's, so
// bench.Summarize, bench.WriteReport and `sluice bench compare` treat a
// virtual run and a real one alike. RunHTTPStats runs the same scenario through
// the real router (server.New over a loopback sim fleet at a TimeScale) and
// converts its times back to model time; the agreement test checks that the
// two agree.
//
// # Model of the router
//
// Each event is handled as the HTTP router would handle it:
//
//   - An arrival calls Scheduler.Submit at its virtual time: its At, or,
//     for an item that follows another's answer (bench.Item.After, as an
//     agent's next turn does), its Pause after that request ended. A
//     bound ticket submits the request to the chosen engine at once (no
//     network, no proxy overhead); a refusal is recorded as the status the
//     proxy would send: 429 for a full queue, 503 for a queue timeout or
//     no healthy worker.
//   - A queued ticket gets a timeout event QueueTimeout after its arrival,
//     which calls Scheduler.Cancel(t, ErrQueueTimeout).
//   - A telemetry scrape every ScrapeInterval publishes each engine's
//     Metrics as an immutable snapshot.Snapshot (requests_deferred,
//     kv_cache_usage_ratio, the DCGM GPU utilisation, slots, health), so
//     the scheduler sees telemetry exactly as stale as a real scraper's.
//     Workers that have been idle since their last scrape are not
//     re-scraped: their snapshot could not change.
//   - The first token and the end of a request are recorded; the end is
//     measured from the moment of binding (as the proxy measures from the
//     attempt's start) and ends the lease through Lease.Complete, the
//     proxy's own finish sequence: stats.Tracker, output estimate, release.
//
// With Config.KVEvents the router also has the exact index of the
// engines' KV-cache events, fed directly from each engine (kvevents.go),
// and requests carry their token blocks, as a vLLM fleet publishing
// events gives them.
//
// Differences from the router, all below the model's resolution: no
// network or SSE latency, no proxy retries (a simulated engine never fails
// before answering), and an engine that cannot ever hold a prompt answers
// 400 immediately, as the simulated llama-server does.
//
// # Concurrency Model
//
// None. A simulation runs on the caller's goroutine from start to end:
// one event heap ordered by virtual time, one virtual clock that the loop
// sets before every scheduler call, engines advanced only by the loop. The
// scheduler's notify and the engines' callbacks never act directly: they
// append to the loop's pending list, which the loop drains in time order,
// so no callback ever re-enters an engine or the scheduler. Separate Runs
// share nothing and may run in parallel.
//
// # Request Lifecycle and Ownership
//
// The loop owns every request from arrival to result: it holds the ticket
// until it is bound or refused, then the lease until the engine reports
// the request done, and releases the lease exactly once, right after
// recording the result.
package vsim
