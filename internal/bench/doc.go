// Package bench measures how predictable an OpenAI-compatible LLM endpoint
// is under load. It is the engine behind `sluice bench`.
//
// A benchmark has three parts:
//
//   - A load: a list of [Item]s, each an arrival offset plus prompt and
//     output lengths. Loads come from recorded traces ([ReadTrace]: the
//     Azure LLM inference CSV, Mooncake JSONL, and length-only ShareGPT or
//     arXiv CSVs combined with synthetic arrivals) or are generated
//     ([Synthesize]: Poisson, gamma, on/off and spike arrivals with
//     heavy-tailed lengths). Everything random is seeded, so a load is
//     reproducible.
//   - An open-loop run ([Run]): every request is sent at its scheduled time
//     whether or not earlier requests have finished, which is how real
//     users behave and the only way to see queueing in the tail. Each
//     request yields a [Result] with its TTFT, end-to-end latency, time per
//     output token, decode rate, status and the worker that served it.
//   - Reporting: [Summarize] reduces results to percentiles, tail ratios
//     (p99/p50), decode-rate spread and goodput under an [SLO];
//     [WriteJSON], [WriteCSV] and [WriteTable] record one run; [WriteReport]
//     draws latency CDFs, per-worker concurrency and decode-rate plots for
//     several named runs side by side, which is what `sluice bench compare`
//     builds on.
//
// # Percentiles
//
// All percentiles use the nearest-rank definition: for n sorted samples
// x[1..n], the p-th percentile is x[ceil(p/100*n)], and p = 0 gives x[1].
// The result is always an observed value, and p99 of fewer than 100
// samples is the maximum, which errs on the side of showing the tail.
package bench
