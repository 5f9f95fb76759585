package telemetry

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
)

func open(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func present(metric string, v float64) Value { return Value{V: v, Present: true, Metric: metric} }
func absent(metric string) Value             { return Value{Metric: metric} }

// checkErr checks err against the expected kind: "" (nil), "missing",
// "malformed" or "other", and that its text names every string in names.
func checkErr(t *testing.T, err error, kind string, names ...string) {
	t.Helper()
	switch kind {
	case "":
		if err != nil {
			t.Fatalf("err = %v, want nil", err)
		}
		return
	case "missing":
		var me *MissingError
		if !errors.Is(err, ErrMissing) || !errors.As(err, &me) {
			t.Fatalf("err = %v, want a *MissingError", err)
		}
	case "malformed":
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("err = %v, want ErrMalformed", err)
		}
	default:
		if err == nil || errors.Is(err, ErrMissing) || errors.Is(err, ErrMalformed) {
			t.Fatalf("err = %v, want another error", err)
		}
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("err %q does not name %q", err, n)
		}
	}
}

func TestParseLlamaCPP_Golden(t *testing.T) {
	tests := []struct {
		file    string
		want    Metrics
		errKind string
		errText []string
	}{
		{
			file: "llamacpp_metrics.txt",
			want: Metrics{
				QueueLen: present(LlamaCPPRequestsDeferred, 5),
				Running:  present(LlamaCPPRequestsProcessing, 2),
				KVUsage:  present(LlamaCPPKVCacheUsageRatio, 0.421875),
				// 3456 cells of 8192 in use.
				KVUsedTokens: present(LlamaCPPKVCacheTokens, 3456),
			},
		},
		{
			// Newer builds dropped kv_cache_usage_ratio: KV is absent,
			// not zero, and its absence is no error.
			file: "llamacpp_metrics_newer.txt",
			want: Metrics{
				QueueLen: present(LlamaCPPRequestsDeferred, 0),
				Running:  present(LlamaCPPRequestsProcessing, 1),
				KVUsage:  absent(LlamaCPPKVCacheUsageRatio),
			},
		},
		{
			// The current build (node-llama-cpp 3.22.1's llama.cpp): no
			// KV series at all, and no error for it.
			file: "llamacpp_metrics_current.txt",
			want: Metrics{
				QueueLen: present(LlamaCPPRequestsDeferred, 1),
				Running:  present(LlamaCPPRequestsProcessing, 2),
				KVUsage:  absent(LlamaCPPKVCacheUsageRatio),
			},
		},
		{
			file: "llamacpp_metrics_partial.txt",
			want: Metrics{
				QueueLen: absent(LlamaCPPRequestsDeferred),
				Running:  present(LlamaCPPRequestsProcessing, 4),
				KVUsage:  present(LlamaCPPKVCacheUsageRatio, 0.9),
			},
			errKind: "missing",
			errText: []string{LlamaCPPRequestsDeferred},
		},
		{
			file:    "llamacpp_metrics_malformed.txt",
			errKind: "malformed",
			errText: []string{"line 6"},
		},
		{
			// Someone else's metrics: everything is missing.
			file: "dcgm_metrics.txt",
			want: Metrics{
				QueueLen: absent(LlamaCPPRequestsDeferred),
				Running:  absent(LlamaCPPRequestsProcessing),
				KVUsage:  absent(LlamaCPPKVCacheUsageRatio),
			},
			errKind: "missing",
			errText: []string{LlamaCPPRequestsDeferred, LlamaCPPRequestsProcessing},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseLlamaCPP(open(t, tt.file))
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseLlamaCPP(%s) mismatch (-want +got):\n%s", tt.file, diff)
			}
		})
	}
}

func TestParseLlamaCPP_MalformedKeepsLine(t *testing.T) {
	_, err := ParseLlamaCPP(open(t, "llamacpp_metrics_malformed.txt"))
	var pe expfmt.ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want an expfmt.ParseError inside", err)
	}
	if got, want := pe.Line, 6; got != want {
		t.Errorf("line = %d, want %d", got, want)
	}
}

func TestParseLlamaCPP_NonFiniteIsMissing(t *testing.T) {
	in := "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\nllamacpp:kv_cache_usage_ratio NaN\n"
	got, err := ParseLlamaCPP(strings.NewReader(in))
	checkErr(t, err, "missing", "not a finite number")
	if got.KVUsage.Present {
		t.Errorf("KVUsage = %+v, want absent", got.KVUsage)
	}
}

func TestParseVLLM_Golden(t *testing.T) {
	const (
		llama = "meta-llama/Llama-3.1-8B-Instruct"
		qwen  = "Qwen/Qwen2.5-7B-Instruct"
	)
	tests := []struct {
		name, file, model string
		want              Metrics
		errKind           string
		errText           []string
	}{
		{
			name: "two models, pick llama", file: "vllm_metrics.txt", model: llama,
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 3),
				Running:  present(VLLMNumRequestsRunning, 7),
				KVUsage:  present(VLLMKVCacheUsagePerc, 0.6523),
			},
		},
		{
			name: "two models, pick qwen", file: "vllm_metrics.txt", model: qwen,
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 0),
				Running:  present(VLLMNumRequestsRunning, 2),
				KVUsage:  present(VLLMKVCacheUsagePerc, 0.125),
			},
		},
		{
			name: "two models, no model aggregates", file: "vllm_metrics.txt", model: "",
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 3),
				Running:  present(VLLMNumRequestsRunning, 9),
				KVUsage:  present(VLLMKVCacheUsagePerc, 0.6523),
			},
		},
		{
			name: "two models, unknown model", file: "vllm_metrics.txt", model: "nope",
			want: Metrics{
				QueueLen: absent(VLLMNumRequestsWaiting),
				Running:  absent(VLLMNumRequestsRunning),
				KVUsage:  absent(VLLMKVCacheUsagePerc),
			},
			errKind: "missing",
			errText: []string{`model_name="nope"`, llama, qwen},
		},
		{
			name: "older name only", file: "vllm_metrics_v0.txt", model: "mistralai/Mistral-7B-Instruct-v0.3",
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 6),
				Running:  present(VLLMNumRequestsRunning, 4),
				KVUsage:  present(VLLMGPUCacheUsagePerc, 0.8841),
				// One vllm:cache_config_info for the whole server.
				PrefixCache: PrefixCache{KVTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size", 7552*16), KVPoolTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size, smallest engine", 7552*16)},
			},
		},
		{
			name: "older name, second model", file: "vllm_metrics_v0.txt", model: "microsoft/Phi-3-mini-4k-instruct",
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 1),
				Running:  present(VLLMNumRequestsRunning, 1),
				KVUsage:  present(VLLMGPUCacheUsagePerc, 0.0312),
				// One vllm:cache_config_info for the whole server.
				PrefixCache: PrefixCache{KVTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size", 7552*16), KVPoolTokens: present(VLLMCacheConfigInfo+" num_gpu_blocks×block_size, smallest engine", 7552*16)},
			},
		},
		{
			name: "data parallel engines", file: "vllm_metrics_dp.txt", model: "meta-llama/Llama-3.1-70B-Instruct",
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 3),
				Running:  present(VLLMNumRequestsRunning, 11),
				KVUsage:  present(VLLMKVCacheUsagePerc, 0.47),
			},
		},
		{
			// One model served: its series are used even when Sluice
			// calls it by an alias.
			name: "single model, alias", file: "vllm_metrics_dp.txt", model: "llama-70b",
			want: Metrics{
				QueueLen: present(VLLMNumRequestsWaiting, 3),
				Running:  present(VLLMNumRequestsRunning, 11),
				KVUsage:  present(VLLMKVCacheUsagePerc, 0.47),
			},
		},
		{
			name: "partial", file: "vllm_metrics_partial.txt", model: llama,
			want: Metrics{
				QueueLen: absent(VLLMNumRequestsWaiting),
				Running:  present(VLLMNumRequestsRunning, 1),
				KVUsage:  absent(VLLMKVCacheUsagePerc),
			},
			errKind: "missing",
			errText: []string{VLLMNumRequestsWaiting, VLLMKVCacheUsagePerc, VLLMGPUCacheUsagePerc},
		},
		{
			name: "malformed", file: "vllm_metrics_malformed.txt", model: llama,
			errKind: "malformed",
			errText: []string{"line 6"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVLLM(open(t, tt.file), tt.model)
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseVLLM(%s, %q) mismatch (-want +got):\n%s", tt.file, tt.model, diff)
			}
		})
	}
}

func TestParseDCGM_Golden(t *testing.T) {
	const (
		uuid0 = "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
		uuid1 = "GPU-edc718f8-e593-6468-b9f9-563d508366ed"
	)
	tests := []struct {
		name, file string
		sel        Selector
		wantUtil   Value
		wantUsed   Value
		wantFree   Value
		wantUUID   string
		errKind    string
		errText    []string
	}{
		{
			name: "gpu 0 by index", file: "dcgm_metrics.txt", sel: Selector{"gpu": "0"},
			wantUtil: present(DCGMGPUUtil, 0.93), wantUsed: present(DCGMFBUsed, 76349), wantFree: present(DCGMFBFree, 4730),
			wantUUID: uuid0,
		},
		{
			name: "gpu 1 by index", file: "dcgm_metrics.txt", sel: Selector{"gpu": "1"},
			wantUtil: present(DCGMGPUUtil, 0.12), wantUsed: present(DCGMFBUsed, 20058), wantFree: present(DCGMFBFree, 61021),
			wantUUID: uuid1,
		},
		{
			name: "gpu 1 by UUID", file: "dcgm_metrics.txt", sel: Selector{"UUID": uuid1},
			wantUtil: present(DCGMGPUUtil, 0.12), wantUsed: present(DCGMFBUsed, 20058), wantFree: present(DCGMFBFree, 61021),
			wantUUID: uuid1,
		},
		{
			name: "two GPUs, no selector", file: "dcgm_metrics.txt", sel: nil,
			wantUtil: absent(DCGMGPUUtil), wantUsed: absent(DCGMFBUsed), wantFree: absent(DCGMFBFree),
			errKind: "other", errText: []string{"matches 2 GPUs", uuid0, uuid1},
		},
		{
			name: "no such GPU", file: "dcgm_metrics.txt", sel: Selector{"gpu": "7"},
			wantUtil: absent(DCGMGPUUtil), wantUsed: absent(DCGMFBUsed), wantFree: absent(DCGMFBFree),
			errKind: "other", errText: []string{`gpu="7"`, `gpu="0"`, `gpu="1"`},
		},
		{
			name: "one GPU, no selector, no FB_USED", file: "dcgm_metrics_k8s.txt", sel: Selector{},
			wantUtil: present(DCGMGPUUtil, 0.57), wantUsed: absent(DCGMFBUsed), wantFree: present(DCGMFBFree, 2011),
			wantUUID: "GPU-74f7fe3b-48f2-6d8b-3cb4-e70426fb669c",
			errKind:  "missing", errText: []string{DCGMFBUsed},
		},
		{
			name: "not dcgm", file: "llamacpp_metrics.txt", sel: Selector{"gpu": "0"},
			wantUtil: absent(DCGMGPUUtil), wantUsed: absent(DCGMFBUsed), wantFree: absent(DCGMFBFree),
			errKind: "missing", errText: []string{DCGMGPUUtil, DCGMFBUsed, DCGMFBFree},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDCGM(open(t, tt.file), tt.sel)
			checkErr(t, err, tt.errKind, tt.errText...)
			if diff := cmp.Diff(tt.wantUtil, got.Util); diff != "" {
				t.Errorf("Util mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantUsed, got.FBUsedMiB); diff != "" {
				t.Errorf("FBUsedMiB mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantFree, got.FBFreeMiB); diff != "" {
				t.Errorf("FBFreeMiB mismatch (-want +got):\n%s", diff)
			}
			if got, want := got.Labels[DCGMLabelUUID], tt.wantUUID; got != want {
				t.Errorf("selected UUID = %q, want %q", got, want)
			}
		})
	}
}

func TestParseDCGM_UtilClamped(t *testing.T) {
	in := `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 104` + "\n"
	got, _ := ParseDCGM(strings.NewReader(in), nil)
	if got, want := got.Util.V, 1.0; got != want {
		t.Errorf("Util = %v, want %v", got, want)
	}
}

func TestParseLlamaCPPHealth_Golden(t *testing.T) {
	tests := []struct {
		file    string
		status  int
		want    HealthResult
		errKind string
	}{
		{"llamacpp_health_ok.json", 200, HealthResult{State: StateReady, Message: "ok"}, ""},
		{"llamacpp_health_ok_slots.json", 200, HealthResult{State: StateReady, Message: "no slot available"}, ""},
		{"llamacpp_health_loading.json", 503, HealthResult{State: StateLoading, Message: "Loading model"}, ""},
		{"llamacpp_health_error.json", 500, HealthResult{State: StateError, Message: "Model failed to load"}, ""},
		{"models_malformed.json", 200, HealthResult{}, "malformed"},
		{"models_malformed.json", 404, HealthResult{State: StateError, Message: "HTTP 404"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseLlamaCPPHealth(tt.status, open(t, tt.file))
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseLlamaCPPHealth(%d, %s) mismatch (-want +got):\n%s", tt.status, tt.file, diff)
			}
		})
	}
}

func TestParseHealthStatus(t *testing.T) {
	if got, want := ParseHealthStatus(200).State, StateReady; got != want {
		t.Errorf("200: state = %v, want %v", got, want)
	}
	if got, want := ParseHealthStatus(503).State, StateError; got != want {
		t.Errorf("503: state = %v, want %v", got, want)
	}
}

func TestParseLlamaCPPProps_Golden(t *testing.T) {
	got, err := ParseLlamaCPPProps(open(t, "llamacpp_props.json"))
	checkErr(t, err, "")
	want := Props{TotalSlots: 4, NCtx: 8192}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseLlamaCPPProps mismatch (-want +got):\n%s", diff)
	}

	_, err = ParseLlamaCPPProps(strings.NewReader(`{"model_path":"x"}`))
	checkErr(t, err, "missing", "total_slots")
	_, err = ParseLlamaCPPProps(open(t, "models_malformed.json"))
	checkErr(t, err, "malformed")
}

func TestParseModels_Golden(t *testing.T) {
	tests := []struct {
		name    string
		parse   func(*os.File) ([]string, error)
		file    string
		want    []string
		errKind string
	}{
		{"llamacpp", llamaModels, "llamacpp_models.json", []string{"llama-3.1-8b-instruct"}, ""},
		{"llamacpp while loading", llamaModels, "llamacpp_models_loading.json", []string{"../models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"}, ""},
		{"llamacpp router", llamaModels, "llamacpp_models_router.json", []string{"qwen2.5-7b-instruct", "llama-3.2-3b"}, ""},
		{"llamacpp malformed", llamaModels, "models_malformed.json", nil, "malformed"},
		{"llamacpp not a list", llamaModels, "llamacpp_props.json", nil, "other"},
		{"vllm", openaiModels, "vllm_models.json", []string{"meta-llama/Llama-3.1-8B-Instruct", "sql-lora"}, ""},
		{"openai", openaiModels, "openai_models.json", []string{"gpt-4o-mini", "text-embedding-3-small"}, ""},
		{"openai reads llamacpp", openaiModels, "llamacpp_models.json", []string{"llama-3.1-8b-instruct"}, ""},
		{"openai malformed", openaiModels, "models_malformed.json", nil, "malformed"},
		{"openai not a list", openaiModels, "llamacpp_health_ok.json", nil, "other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(open(t, tt.file))
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("models mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseOpenAIModels_EmptyIsKnown(t *testing.T) {
	got, err := ParseOpenAIModels(strings.NewReader(`{"object":"list","data":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || len(got) != 0 {
		t.Errorf("models = %#v, want a non-nil empty slice", got)
	}
}

func TestParseLlamaCPPModels_OllamaListOnly(t *testing.T) {
	got, err := ParseLlamaCPPModels(strings.NewReader(`{"models":[{"name":"a","model":"a"},{"name":"b"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" {
		t.Errorf("models mismatch (-want +got):\n%s", diff)
	}
}

func llamaModels(f *os.File) ([]string, error)  { return ParseLlamaCPPModels(f) }
func openaiModels(f *os.File) ([]string, error) { return ParseOpenAIModels(f) }
