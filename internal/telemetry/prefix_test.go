package telemetry

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLlamaCPPSlots_Prompts(t *testing.T) {
	const (
		raw  = "<|begin_of_text|>You are a terse assistant. Answer in one line.\nQ: What is the capital of France?\nA:"
		chat = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWrite a haiku about rain.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	)
	tests := []struct {
		name    string
		body    string // or file
		file    string
		want    Slots
		errKind string
		errText []string
	}{
		{
			// A current build with LLAMA_SERVER_SLOTS_DEBUG=1: prompts of
			// the current and the last task, none for a slot never used.
			name: "debug build", file: "llamacpp_slots_debug.json",
			want: Slots{
				Slots: []SlotState{
					{ID: 0, Prompt: raw, HasPrompt: true},
					{ID: 1, Prompt: chat, HasPrompt: true},
					{ID: 2},
				},
				Busy: 1, NCtx: 8192, Prompts: 2,
				KVUsage: present(SlotsKVMetric, 38.0/(3*8192)),
			},
		},
		{
			// The default of current builds: metrics only, no prompt.
			name: "metrics only", file: "llamacpp_slots.json",
			want: Slots{Slots: []SlotState{{ID: 0}, {ID: 1}}, Busy: 1, NCtx: 65536, KVUsage: absent(SlotsKVMetric)},
		},
		{
			// Early 2024 builds echoed the request's JSON prompt, which
			// may be an array of token ids: not text, ignored.
			name: "token array prompt",
			body: `[{"id":0,"n_ctx":2048,"is_processing":false,"prompt":[1,15043,3186]},{"id":1,"n_ctx":2048,"is_processing":false,"prompt":""}]`,
			want: Slots{Slots: []SlotState{{ID: 0}, {ID: 1, HasPrompt: true}}, NCtx: 2048, Prompts: 1, KVUsage: present(SlotsKVMetric, 0)},
		},
		{
			name: "prompt not JSON text", body: `[{"id":0,"n_ctx":2048,"is_processing":true,"prompt":"unterminated}]`,
			errKind: "malformed",
		},
		{
			name: "prompt of the wrong type", body: `[{"id":0,"n_ctx":2048,"is_processing":true,"prompt":{"text":"x"}}]`,
			want: Slots{Slots: []SlotState{{ID: 0}}, Busy: 1, NCtx: 2048, KVUsage: absent(SlotsKVMetric)},
		},
		{
			name: "an object, not a list", body: `{"slots":[{"id":0,"prompt":"x"}]}`,
			errKind: "malformed",
		},
		{
			name: "error body", body: `{"error":{"code":501,"message":"This server does not support slots endpoint. Start it with ` + "`--slots`" + `","type":"not_supported_error"}}`,
			errKind: "malformed",
		},
		{
			name: "empty list", body: `[]`,
			errKind: "missing", errText: []string{"empty"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Slots
			var err error
			if tt.file != "" {
				got, err = ParseLlamaCPPSlots(open(t, tt.file))
			} else {
				got, err = ParseLlamaCPPSlots(strings.NewReader(tt.body))
			}
			checkErr(t, err, tt.errKind, tt.errText...)
			if tt.errKind == "malformed" {
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseLlamaCPPSlots mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseVLLM_PrefixCache(t *testing.T) {
	got, err := ParseVLLM(open(t, "vllm_metrics_prefix.txt"), "llama-70b")
	checkErr(t, err, "")
	want := PrefixCache{
		Queries:  present(VLLMPrefixCacheQueries, 200000),
		Hits:     present(VLLMPrefixCacheHits, 120000),
		KVTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size", 2*29127*16), KVPoolTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size, smallest engine", 29127*16),
	}
	if diff := cmp.Diff(want, got.PrefixCache); diff != "" {
		t.Errorf("PrefixCache mismatch (-want +got):\n%s", diff)
	}

	// vLLM before the v1 names: the cache config is there, with
	// prefix caching off and no counters.
	got, err = ParseVLLM(open(t, "vllm_metrics_v0.txt"), "mistralai/Mistral-7B-Instruct-v0.3")
	checkErr(t, err, "")
	want = PrefixCache{KVTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size", 7552*16), KVPoolTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size, smallest engine", 7552*16)}
	if diff := cmp.Diff(want, got.PrefixCache); diff != "" {
		t.Errorf("v0 PrefixCache mismatch (-want +got):\n%s", diff)
	}

	// The deprecated gpu_ counters without hits, and a config whose
	// blocks are not known yet: nothing.
	body := `# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m",engine="0"} 10
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5
`
	got, err = ParseVLLM(strings.NewReader(body), "m")
	checkErr(t, err, "")
	if diff := cmp.Diff(PrefixCache{}, got.PrefixCache); diff != "" {
		t.Errorf("partial PrefixCache mismatch (-want +got):\n%s", diff)
	}
}
