// Package fleet keeps Sluice's list of workers and what is known of each:
// whether it is healthy, which models it has loaded, how many slots it
// has, and its live load (queue length, KV-cache pressure, GPU
// utilisation). Each Worker is a scheduler.Source: the scheduler reads its
// latest immutable Snapshot and never waits on the network.
//
// What is probed depends on the worker's kind:
//
//   - llamacpp: GET /health (503 while the model loads: HealthLoading, not
//     eligible), /metrics, /slots (busy slots, per-slot n_ctx, the KV
//     pressure of current builds, whose /metrics has none, and, when the
//     server tells them, each slot's prompt, hashed into the router's
//     blocks as the worker's cache report), /props (total_slots, the BOS
//     text) and /v1/models.
//   - vllm: GET /health, /metrics (the series of the worker's model, the
//     prefix-cache hit rate between two scrapes, the KV cache size from
//     vllm:cache_config_info) and /v1/models (with max_model_len).
//   - sglang: GET /health, /metrics (sglang: series) and /v1/models.
//   - tgi: GET /health, /info (model, max_total_tokens, batch token
//     budget) and /metrics (tgi_ series).
//   - trtllm: GET /health, /metrics (trtllm-serve's iteration statistics,
//     JSON) and /v1/models.
//   - ollama: GET / ("Ollama is running") and /api/ps (loaded models,
//     context_length); no load readings.
//   - openai: GET /v1/models only; the worker is healthy when it answers,
//     and has no telemetry readings.
//
// A worker with a GPUMetrics URL also has its dcgm-exporter scraped for the
// GPU its GPUSelector picks. Models are re-read every ModelRefresh (and
// whenever a worker becomes healthy), so a model loaded or unloaded on a
// worker changes where requests go without restarting Sluice.
//
// Health follows consecutive outcomes: FailThreshold failures in a row
// (failed probes and failed requests alike, through ReportRequest) eject a
// worker (HealthDown); RiseThreshold passes in a row re-admit it. Telemetry
// trouble (a malformed or partial /metrics) never ejects a worker whose
// /health is fine: its readings keep their old times and so grow stale, and
// one log line says what is wrong, repeated only when the problem changes.
//
// # Concurrency Model
//
// Each worker has one scraper goroutine, started by Fleet.Add and stopped
// by Fleet.Remove or Fleet.Close. It runs one probe round, waits Interval,
// and runs the next; rounds never overlap (ScrapeNow runs a round in the
// caller's goroutine, serialised with the scraper's). Every HTTP probe has
// its own Timeout, so a hung worker stalls only its own scraper and never
// another worker's, nor any routing decision.
//
// A worker's mutable state (health counters, models, slots, readings) is
// owned by a mutex inside the Worker. Probes and request reports change it
// through the same methods; each change builds a new snapshot.Snapshot
// under that mutex and publishes it with an atomic.Pointer store, so
// Worker.Snapshot is one atomic load, never blocks and always returns a
// complete, immutable snapshot. Nothing is ever written to a published
// Snapshot.
//
// Options.OnChange is called after the mutex is released, from the
// scraper goroutine or from the goroutine that reported a request, when a
// worker's health, models or slot count changed: exactly the changes that
// may let queued requests be placed. It must return quickly.
//
// The Fleet's own mutex guards only its map of workers; it is never held
// while probing or while calling OnChange.
package fleet
