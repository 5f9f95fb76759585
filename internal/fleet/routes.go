package fleet

// Which engines serve the Anthropic Messages API, read in their sources
// (a worker whose kind lacks a route is not eligible for it:
// scheduler.WorkerSpec.Unserved):
//
//   - llama.cpp's llama-server serves POST /v1/messages and
//     /v1/messages/count_tokens (ggml-org/llama.cpp
//     tools/server/server.cpp, routes post_anthropic_messages and
//     post_anthropic_count_tokens);
//   - vLLM serves both (vllm-project/vllm
//     vllm/entrypoints/anthropic/api_router.py);
//   - SGLang serves both (sgl-project/sglang README_Anthropic_API.md,
//     python/sglang/srt/entrypoints/anthropic);
//   - Ollama serves /v1/messages since v0.14.0 (its Anthropic
//     compatibility); no count_tokens route was found;
//   - text-generation-inference and TensorRT-LLM's trtllm-serve serve
//     OpenAI's routes only, and a generic OpenAI-compatible server is
//     not assumed to serve Anthropic's.
//
// Routes every engine serves (chat completions, completions, ...) are not
// listed: the scheduler holds only these against a worker.
var unserved = map[string][]string{
	KindOllama: {"/v1/messages/count_tokens"},
	KindTGI:    {"/v1/messages", "/v1/messages/count_tokens"},
	KindTRTLLM: {"/v1/messages", "/v1/messages/count_tokens"},
	KindOpenAI: {"/v1/messages", "/v1/messages/count_tokens"},
}

// Unserved returns the client routes a worker of kind is known not to
// serve, for scheduler.WorkerSpec.Unserved.
func Unserved(kind string) []string { return unserved[kind] }
