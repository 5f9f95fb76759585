// Package sim simulates GPU inference workers that speak llama.cpp's
// llama-server HTTP API, so that Sluice's router, its tests, `sluice demo`
// and the benchmark harness can run against workers that misbehave the way
// GPUs do: collisions make everyone unpredictably slow, a long prompt stalls
// every stream on the card, a full card queues, and an outgrown KV cache
// throws work away (the cliff).
//
// It has three layers:
//
//   - Engine, a pure discrete-event model of one worker. It never reads the
//     clock, sleeps or starts goroutines: every call takes the current model
//     time, so a virtual-time simulation can drive thousands of them.
//   - Server, an http.Handler that runs an Engine in (optionally scaled)
//     real time behind llama-server's endpoints: /v1/chat/completions,
//     /v1/completions, /completion, /health, /v1/models, /props, /slots,
//     /metrics (llama.cpp's metric names) and, on its own path,
//     /dcgm/metrics (the DCGM exporter's DCGM_FI_DEV_GPU_UTIL gauge).
//   - Fleet, several Servers on consecutive loopback ports in one process,
//     described by a YAML or JSON file or by DemoFleet.
//
// # Model
//
// The engine runs in steps, as llama-server's continuous batching loop
// calls llama_decode once per iteration. A step carries one token for each
// decoding sequence, then prompt tokens of the sequences still prefilling,
// in admission order, up to BatchTokens in all (llama-server's n_batch,
// 2048 by default), so a long prompt is prefilled in chunks over several
// steps and gets its first token from the step that ends its prompt. Its
// duration is
//
//	step = (P/PrefillTokensPerSec + [d>0]·(DecodeBase + DecodePerSeq·d)) · F / Speed
//
// with P the prompt tokens prefilled in the step and d the sequences
// decoding. A sequence alone therefore takes exactly
// prompt/PrefillTokensPerSec + (n-1)·(DecodeBase+DecodePerSeq) / Speed for
// n tokens (its chunks have nobody to wait for), and a prefill chunk in a
// step stalls every decoding sequence by its length.
//
// Interference: F = 1 for a step carrying one sequence; with k >= 2
// sequences F = 1 + InterferenceScale·(k-1)·L, L ~ LogNormal(0,
// InterferenceSigma), drawn whenever the batch's membership changes and
// held until it changes again. A collision thus slows every sequence in it
// by an amount nobody can predict, heavy-tailed and lasting, not merely by
// the proportional batch cost. With the defaults (0.1, 1.0) two sequences
// run at a median 1.1x and p99 2.0x the clean step time, four at 1.3x and
// 4.1x. This term is a modelling choice made to reproduce the p99 ≈ 4×p50
// behaviour described in "Why your load balancer is wrong about GPUs"; it is not fitted to a measurement (the
// vLLM sweep cited below shows nearly free batching for fixed-length
// requests). Set InterferenceScale to 0 to get the clean curve.
//
// Slots and queue: at most Slots sequences are resident; the rest wait in
// a FIFO (llama.cpp's requests_deferred). A sequence is admitted on arrival
// if a slot is free and its prompt fits in the free KV cache, and is
// prefilled by the next step.
//
// KV cache: KVTokens tokens shared by all slots; each resident sequence
// holds prompt+generated tokens, one more per step. When the resident
// sequences outgrow the cache, the most recently admitted is preempted:
// its KV is dropped, it returns to the front of the queue and, when
// readmitted, recomputes a prefill of prompt+generated-so-far. Tokens
// already streamed are not sent again. A sequence that alone outgrows the
// cache stops with finish reason "length" (its context is full).
//
// Output length: exactly MaxTokens with IgnoreEOS (OutputMax without
// MaxTokens); otherwise round(OutputMedian·exp(OutputSigma·N(0,1)))
// clamped to [OutputMin, OutputMax] and capped at MaxTokens when set. The
// defaults (median 180, sigma 1.0, 10..2000) give p90 ≈ 650 and p99 ≈ 1840
// tokens: "one completion emits 10 tokens, the next 2,000".
//
// Everything random comes from one PCG generator seeded with Seed, drawn in
// call order, so equal seeds and equal call sequences give equal runs.
//
// Default parameters (DefaultParams): Llama-3-8B-Instruct with 16-bit
// weights on the reference card, an NVIDIA A100 40GB.
//
//   - Decode: 75 tokens/s for one stream (DecodeBase 12.9 ms + DecodePerSeq
//     0.4 ms = 13.3 ms), and a 6.6x aggregate gain at 8 concurrent
//     streams, which fixes DecodePerSeq ≈ (8/6.6 - 1)·13.3 ms / 7 ≈ 0.4 ms.
//     Source: J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100"
//     (Llama-3.1-8B-Instruct BF16, vLLM 0.23, 1024 in / 128 out),
//     https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on
//   - Prefill: 5,000 tokens/s (a 1,024-token prompt recomputed in about
//     205 ms on an A100; the same table gives about 10,000 tokens/s on an
//     H100). Source: https://gangmuk.github.io/blog/2025/11/21/kv
//   - KV bytes per token: 2·32 layers·8 KV heads·128·2 bytes = 128 KiB
//     (same source). KVTokens = 4 GiB / 128 KiB = 32,768, what llama-server
//     allocates for -c 32768; the whole 40 GB card could hold about 150,000.
//   - Speed: about 2 for an H100 ("H100 offers ~2x better throughput and
//     lower latency than A100", Lambda's vLLM benchmark,
//     https://github.com/LambdaLabsML/vllm-benchmark, benchmark_v0.md).
//   - Slots 4, StartupDelay 0, Seed 1 are choices, not measurements.
//
// The llama.cpp endpoint shapes and metric names follow llama.cpp's
// tools/server (README "GET /metrics" and the metrics handler in
// server-context.cpp); see docs/sim.md.
//
// # Concurrency Model
//
// An Engine is not safe for concurrent use and has no goroutines. Its
// callbacks run synchronously inside Engine calls, in time order, after
// the engine's state is consistent; they must not block, and may call
// Submit and Cancel on the same engine (for closed-loop clients), which
// then act at the callback's time.
//
// A Server owns one Engine behind a mutex. One driver goroutine sleeps on a
// timer until the engine's next event (converted from model to real time:
// model time = start + real elapsed · TimeScale), advances the engine and
// goes back to sleep; handlers wake it after submitting. Engine callbacks
// record each request's progress and signal the handler's channel without
// blocking; the handler writes its tokens, one SSE event each, and cancels
// its sequence when the client goes away. Close stops the driver and ends
// handlers in flight.
//
// # Request Lifecycle and Ownership
//
// A handler owns its request from parse to the last byte written. Submit
// hands the sequence to the engine; from then on only the engine changes
// it, and the handler's only way to end it early is Cancel (client
// disconnect, write failure), which frees its slot and KV at once.
package sim
