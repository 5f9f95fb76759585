package telemetry

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSGLang_Golden(t *testing.T) {
	const (
		llama = "meta-llama/Llama-3.1-8B-Instruct"
		qwen  = "Qwen/Qwen2.5-32B-Instruct"
	)
	tests := []struct {
		name, file, model string
		want              Metrics
		errKind           string
		errText           []string
	}{
		{
			name: "documented example", file: "sglang_metrics.txt", model: llama,
			want: Metrics{
				QueueLen: present(SGLangNumQueueReqs, 2826),
				Running:  present(SGLangNumRunningReqs, 162),
				KVUsage:  present(SGLangTokenUsage, 0.28),
			},
		},
		{
			// One model served: used whatever Sluice calls it.
			name: "alias", file: "sglang_metrics.txt", model: "llama-8b",
			want: Metrics{
				QueueLen: present(SGLangNumQueueReqs, 2826),
				Running:  present(SGLangNumRunningReqs, 162),
				KVUsage:  present(SGLangTokenUsage, 0.28),
			},
		},
		{
			// Two data-parallel ranks: counts add up, KV is the fuller rank.
			name: "data parallel ranks", file: "sglang_metrics_dp.txt", model: qwen,
			want: Metrics{
				QueueLen: present(SGLangNumQueueReqs, 4),
				Running:  present(SGLangNumRunningReqs, 21),
				KVUsage:  present(SGLangTokenUsage, 0.57),
			},
		},
		{
			name: "partial", file: "sglang_metrics_partial.txt", model: llama,
			want: Metrics{
				QueueLen: absent(SGLangNumQueueReqs),
				Running:  present(SGLangNumRunningReqs, 3),
				KVUsage:  absent(SGLangTokenUsage),
			},
			errKind: "missing",
			errText: []string{SGLangNumQueueReqs, SGLangTokenUsage},
		},
		{
			name: "vllm payload", file: "vllm_metrics.txt", model: llama,
			want: Metrics{
				QueueLen: absent(SGLangNumQueueReqs),
				Running:  absent(SGLangNumRunningReqs),
				KVUsage:  absent(SGLangTokenUsage),
			},
			errKind: "missing",
		},
		{
			name: "malformed", file: "vllm_metrics_malformed.txt", model: llama,
			errKind: "malformed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSGLang(open(t, tt.file), tt.model)
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseSGLang(%s, %q) mismatch (-want +got):\n%s", tt.file, tt.model, diff)
			}
		})
	}
}

func TestParseSGLang_TensorRanksNotDoubleCounted(t *testing.T) {
	in := `sglang:num_running_reqs{model_name="m",tp_rank="0"} 5
sglang:num_running_reqs{model_name="m",tp_rank="1"} 5
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 2
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
sglang:token_usage{model_name="m",tp_rank="1"} 0.5
`
	got, err := ParseSGLang(strings.NewReader(in), "m")
	checkErr(t, err, "")
	if got.Running.V != 5 || got.QueueLen.V != 2 {
		t.Errorf("running %v queue %v, want 5 and 2 (one scheduler seen by two ranks)", got.Running.V, got.QueueLen.V)
	}
}

func TestParseSGLang_PicksModelAmongSeveral(t *testing.T) {
	in := `sglang:num_running_reqs{model_name="a"} 1
sglang:num_running_reqs{model_name="b"} 7
sglang:num_queue_reqs{model_name="a"} 0
sglang:num_queue_reqs{model_name="b"} 3
sglang:token_usage{model_name="a"} 0.1
sglang:token_usage{model_name="b"} 0.9
`
	got, err := ParseSGLang(strings.NewReader(in), "b")
	checkErr(t, err, "")
	want := Metrics{
		QueueLen: present(SGLangNumQueueReqs, 3),
		Running:  present(SGLangNumRunningReqs, 7),
		KVUsage:  present(SGLangTokenUsage, 0.9),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mismatch (-want +got):\n%s", diff)
	}
	_, err = ParseSGLang(strings.NewReader(in), "c")
	checkErr(t, err, "missing", `model_name="c"`, "a, b")
}

func TestParseTGI_Golden(t *testing.T) {
	tests := []struct {
		name, file string
		budget     int
		want       Metrics
		errKind    string
		errText    []string
	}{
		{
			name: "with budget", file: "tgi_metrics.txt", budget: 32000,
			want: Metrics{
				QueueLen: present(TGIQueueSize, 6),
				Running:  present(TGIBatchCurrentSize, 4),
				KVUsage:  present(TGIBatchCurrentMaxTokens, 0.32),
			},
		},
		{
			name: "no budget in info", file: "tgi_metrics.txt", budget: 0,
			want: Metrics{
				QueueLen: present(TGIQueueSize, 6),
				Running:  present(TGIBatchCurrentSize, 4),
				KVUsage:  absent(TGIBatchCurrentMaxTokens),
			},
			errKind: "missing",
			errText: []string{"max_batch_total_tokens"},
		},
		{
			name: "partial", file: "tgi_metrics_partial.txt", budget: 32000,
			want: Metrics{
				QueueLen: present(TGIQueueSize, 0),
				Running:  absent(TGIBatchCurrentSize),
				KVUsage:  absent(TGIBatchCurrentMaxTokens),
			},
			errKind: "missing",
			errText: []string{TGIBatchCurrentSize, TGIBatchCurrentMaxTokens},
		},
		{
			name: "malformed", file: "llamacpp_metrics_malformed.txt", budget: 1,
			errKind: "malformed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTGI(open(t, tt.file), tt.budget)
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseTGI(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseTGIInfo_Golden(t *testing.T) {
	tests := []struct {
		file    string
		want    TGIInfo
		errKind string
	}{
		{file: "tgi_info.json", want: TGIInfo{
			ModelID: "meta-llama/Llama-3.1-8B-Instruct", MaxTotalTokens: 8192,
		}},
		{file: "tgi_info_v2.json", want: TGIInfo{
			ModelID: "bigscience/blomm-560m", MaxTotalTokens: 2048, MaxBatchTotalTokens: 32000,
		}},
		{file: "openai_models.json", errKind: "missing"},
		{file: "models_malformed.json", errKind: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseTGIInfo(open(t, tt.file))
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseTGIInfo(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseTGIHealth(t *testing.T) {
	if got := ParseTGIHealth(200, strings.NewReader("")); got.State != StateReady {
		t.Errorf("200: %+v, want ready", got)
	}
	got := ParseTGIHealth(503, open(t, "tgi_health_unhealthy.json"))
	if got.State != StateError || got.Message != "HTTP 503: unhealthy (healthcheck)" {
		t.Errorf("503: %+v, want error with TGI's words", got)
	}
	if got := ParseTGIHealth(502, strings.NewReader("<html>")); got.Message != "HTTP 502" {
		t.Errorf("502: %+v", got)
	}
}

func TestParseOllamaPS_Golden(t *testing.T) {
	tests := []struct {
		file    string
		want    []OllamaModel
		errKind string
	}{
		{file: "ollama_ps.json", want: []OllamaModel{{Name: "mistral:latest"}}},
		{file: "ollama_ps_context.json", want: []OllamaModel{
			{Name: "gemma3", ContextLength: 4096},
			{Name: "qwen3:8b", ContextLength: 8192},
		}},
		{file: "ollama_ps_empty.json", want: []OllamaModel{}},
		{file: "openai_models.json", errKind: "other"},
		{file: "models_malformed.json", errKind: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseOllamaPS(open(t, tt.file))
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseOllamaPS(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseOllamaRoot(t *testing.T) {
	got, err := ParseOllamaRoot(200, open(t, "ollama_root.txt"))
	checkErr(t, err, "")
	if got.State != StateReady {
		t.Errorf("state %v, want ready", got.State)
	}
	got, err = ParseOllamaRoot(200, strings.NewReader(`{"status":"ok"}`))
	checkErr(t, err, "malformed", "Ollama is running")
	if got.State != StateUnknown {
		t.Errorf("other server: state %v, want unknown", got.State)
	}
	got, err = ParseOllamaRoot(500, strings.NewReader(""))
	checkErr(t, err, "")
	if got.State != StateError {
		t.Errorf("500: state %v, want error", got.State)
	}
}

func TestParseTRTLLMStats_Golden(t *testing.T) {
	tests := []struct {
		file    string
		want    Metrics
		errKind string
		errText []string
	}{
		{
			// The last iteration wins.
			file: "trtllm_stats.json",
			want: Metrics{
				QueueLen: present(TRTLLMNumQueuedRequests, 3),
				Running:  present(TRTLLMNumActiveRequests, 5),
				KVUsage:  present(TRTLLMKVCacheUsedBlocks, 25314.0/101256.0),
			},
		},
		{
			file: "trtllm_stats_empty.json",
			want: Metrics{
				QueueLen: absent(TRTLLMNumQueuedRequests),
				Running:  absent(TRTLLMNumActiveRequests),
				KVUsage:  absent(TRTLLMKVCacheUsedBlocks),
			},
			errKind: "missing",
			errText: []string{"enable_iter_perf_stats"},
		},
		{file: "openai_models.json", errKind: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseTRTLLMStats(open(t, tt.file))
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseTRTLLMStats(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseTRTLLMStats_NoKVStats(t *testing.T) {
	got, err := ParseTRTLLMStats(strings.NewReader(`[{"iter":1,"numActiveRequests":2,"numQueuedRequests":0}]`))
	checkErr(t, err, "missing", TRTLLMKVCacheUsedBlocks)
	if !got.Running.Present || got.Running.V != 2 || got.KVUsage.Present {
		t.Errorf("got %+v", got)
	}
}

func TestParseModelCards_Golden(t *testing.T) {
	tests := []struct {
		file    string
		want    []ModelCard
		errKind string
	}{
		{file: "vllm_models.json", want: []ModelCard{
			{ID: "meta-llama/Llama-3.1-8B-Instruct", MaxModelLen: 131072},
			{ID: "sql-lora", Parent: "meta-llama/Llama-3.1-8B-Instruct"},
		}},
		{file: "vllm_models_lora.json", want: []ModelCard{
			{ID: "meta-llama/Llama-3.1-8B-Instruct", MaxModelLen: 8192},
			{ID: "sql-lora", Parent: "meta-llama/Llama-3.1-8B-Instruct"},
			{ID: "chat-lora", Parent: "meta-llama/Llama-3.1-8B-Instruct"},
		}},
		{file: "sglang_models.json", want: []ModelCard{{ID: "meta-llama/Llama-3.1-8B-Instruct", MaxModelLen: 131072}}},
		{file: "trtllm_models.json", want: []ModelCard{{ID: "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}}},
		{file: "ollama_ps.json", errKind: "other"},
		{file: "models_malformed.json", errKind: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseModelCards(open(t, tt.file))
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseModelCards(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseLlamaCPPSlots_Golden(t *testing.T) {
	got, err := ParseLlamaCPPSlots(open(t, "llamacpp_slots.json"))
	checkErr(t, err, "")
	want := Slots{
		Slots: []SlotState{{ID: 0}, {ID: 1}},
		Busy:  1,
		NCtx:  65536,
		// This build's busy slot does not say what it holds.
		KVUsage: absent(SlotsKVMetric),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseLlamaCPPSlots mismatch (-want +got):\n%s", diff)
	}

	_, err = ParseLlamaCPPSlots(strings.NewReader(`[]`))
	checkErr(t, err, "missing", "empty")
	got, err = ParseLlamaCPPSlots(strings.NewReader(`[{"id":0,"is_processing":true}]`))
	checkErr(t, err, "missing", "slot 0 n_ctx")
	if got.Busy != 1 || got.NCtx != 0 {
		t.Errorf("partial slots: %+v", got)
	}
	_, err = ParseLlamaCPPSlots(open(t, "llamacpp_props.json"))
	checkErr(t, err, "malformed")
}

func TestParseLlamaCPPSlots_CurrentBuildGivesKVUsage(t *testing.T) {
	got, err := ParseLlamaCPPSlots(open(t, "llamacpp_slots_current.json"))
	checkErr(t, err, "")
	want := Slots{
		Slots: []SlotState{{ID: 0}, {ID: 1}, {ID: 2}, {ID: 3}},
		Busy:  2,
		NCtx:  2048,
		// (1000 + 536) / (4 × 2048): the busy slots only; slot 2's cached
		// prompt is given up to the next request.
		KVUsage: present(SlotsKVMetric, 0.1875),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseLlamaCPPSlots mismatch (-want +got):\n%s", diff)
	}
}

func TestParseLlamaCPPSlots_KVUsageCases(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Value
	}{
		{"no slot busy: nothing held for running requests", `[{"id":0,"n_ctx":1024,"is_processing":false,"n_prompt_tokens":900},{"id":1,"n_ctx":1024,"is_processing":false}]`, present(SlotsKVMetric, 0)},
		{"a busy slot without a count: unknown", `[{"id":0,"n_ctx":1024,"is_processing":true,"id_task":3},{"id":1,"n_ctx":1024,"is_processing":true,"n_prompt_tokens":100}]`, absent(SlotsKVMetric)},
		{"a full slot", `[{"id":0,"n_ctx":1000,"is_processing":true,"n_prompt_tokens":1000}]`, present(SlotsKVMetric, 1)},
		{"a slot without n_ctx: unknown", `[{"id":0,"is_processing":true,"n_prompt_tokens":10}]`, absent(SlotsKVMetric)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := ParseLlamaCPPSlots(strings.NewReader(tt.body))
			if diff := cmp.Diff(tt.want, got.KVUsage); diff != "" {
				t.Errorf("KVUsage mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseLlamaCPPProps_CurrentBuild(t *testing.T) {
	got, err := ParseLlamaCPPProps(open(t, "llamacpp_props_current.json"))
	checkErr(t, err, "")
	want := Props{TotalSlots: 4, NCtx: 2048, BOSToken: "<|begin_of_text|>"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseLlamaCPPProps mismatch (-want +got):\n%s", diff)
	}
}
