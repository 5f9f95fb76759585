// Package telemetry parses what inference workers and GPU exporters say
// about themselves: Prometheus text from llama.cpp, vLLM, SGLang,
// text-generation-inference and NVIDIA's dcgm-exporter; the JSON of
// llama.cpp's /health, /props and /slots (with the prompt text each slot
// holds, when the server reports it), TGI's /info, trtllm-serve's
// iteration statistics, Ollama's /api/ps and the OpenAI /v1/models list
// (with vLLM's and SGLang's max_model_len).
//
// The parsers are pure: they read an io.Reader (or a status code and a
// body) and return values; they do no HTTP, keep no state and never log.
// The fleet package fetches the payloads and turns the results into
// scheduler snapshots.
//
// A metric that a payload does not carry is reported as absent (a Value
// with Present false), never as zero, and the parser returns a
// *MissingError naming every absent metric next to the partial result, so
// a caller can use what is there and say what is not. Metrics that some
// builds of a server never export are optional, absent without an error:
// llama.cpp's KV-cache series, which current builds dropped
// (testdata/README.md says which build exports what). Malformed input is
// an error naming the problem, with the line number when the Prometheus
// parser gives one.
//
// Prometheus text is parsed with expfmt's TextParser using UTF-8 name
// validation, so names with a colon (llamacpp:..., vllm:...) are fine.
package telemetry
