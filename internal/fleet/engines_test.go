package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/snapshot"
)

func TestWorker_LlamaCPPSlots(t *testing.T) {
	h := newHarness(t, Options{})
	fs := llamaServer(t)
	fs.set("/slots", 200, testdata(t, "llamacpp_slots.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})

	if got, want := w.Snapshot().ContextTokens, 65536; got != want {
		t.Errorf("ContextTokens = %d, want %d (from /slots n_ctx, not /props)", got, want)
	}
	// /metrics said how many requests run: /slots does not override it.
	if got := w.State().Running; got.Value != 2 || !strings.Contains(got.Source, "/metrics") {
		t.Errorf("Running = %+v, want 2 from /metrics", got)
	}

	// Without requests_processing in /metrics, the busy slots count.
	fs.set("/metrics", 200, "llamacpp:requests_deferred 0\n")
	h.clock.Advance(1)
	h.scrape(t, "a")
	st := w.State()
	if st.Running.Value != 1 || st.Running.Source != "llamacpp /slots is_processing" {
		t.Errorf("Running = %+v, want 1 busy slot from /slots", st.Running)
	}
	if st.SlotsError != "" {
		t.Errorf("SlotsError = %q", st.SlotsError)
	}

	// --no-slots: the error is recorded, the context stays known.
	fs.set("/slots", 501, `{"error":{"code":501,"message":"This server does not support slots endpoint.","type":"not_supported_error"}}`)
	h.clock.Advance(1)
	h.scrape(t, "a")
	st = w.State()
	if !strings.Contains(st.SlotsError, "501") || w.Snapshot().ContextTokens != 65536 {
		t.Errorf("after --no-slots: slots error %q, context %d", st.SlotsError, w.Snapshot().ContextTokens)
	}
	if st.Health != snapshot.HealthOK {
		t.Errorf("health %v: a missing /slots is not a failure", st.Health)
	}
}

func TestWorker_SGLang(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	fs.set("/metrics", 200, testdata(t, "sglang_metrics.txt"))
	fs.set("/v1/models", 200, testdata(t, "sglang_models.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "s", URL: srv.URL, Kind: KindSGLang})

	at := h.clock.Now()
	want := &snapshot.Snapshot{
		Health:        snapshot.HealthOK,
		Models:        []string{"meta-llama/Llama-3.1-8B-Instruct"},
		ContextTokens: 131072,
		QueueLen:      snapshot.Reading{Value: 2826, Source: "sglang /metrics sglang:num_queue_reqs", At: at},
		KVPressure:    snapshot.Reading{Value: 0.28, Source: "sglang /metrics sglang:token_usage", At: at},
	}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}
	if got := w.State().Running.Value; got != 162 {
		t.Errorf("Running = %v, want 162", got)
	}

	fs.set("/health", 503, "")
	h.scrape(t, "s")
	if got := w.State().ConsecutiveFailures; got != 1 {
		t.Errorf("503 from /health: failures = %d, want 1", got)
	}
}

func TestWorker_TGI(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	fs.set("/info", 200, testdata(t, "tgi_info_v2.json"))
	fs.set("/metrics", 200, testdata(t, "tgi_metrics.txt"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "t", URL: srv.URL, Kind: KindTGI})

	at := h.clock.Now()
	want := &snapshot.Snapshot{
		Health:        snapshot.HealthOK,
		Models:        []string{"bigscience/blomm-560m"},
		ContextTokens: 2048,
		QueueLen:      snapshot.Reading{Value: 6, Source: "tgi /metrics tgi_queue_size", At: at},
		KVPressure:    snapshot.Reading{Value: 0.32, Source: "tgi /metrics tgi_batch_current_max_tokens", At: at},
	}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}

	// A dead shard: TGI's words reach the health reason.
	fs.set("/health", 503, testdata(t, "tgi_health_unhealthy.json"))
	h.scrape(t, "t")
	if st := w.State(); st.ConsecutiveFailures != 1 || !strings.Contains(st.Reason, "unhealthy (healthcheck)") {
		t.Errorf("after 503: %+v", st)
	}
}

func TestWorker_TGINewerInfoHasNoBudget(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	fs.set("/info", 200, testdata(t, "tgi_info.json"))
	fs.set("/metrics", 200, testdata(t, "tgi_metrics.txt"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "t", URL: srv.URL, Kind: KindTGI})

	snap := w.Snapshot()
	if snap.KVPressure.Known() || snap.ContextTokens != 8192 || !snap.QueueLen.Known() {
		t.Errorf("snapshot %+v: want queue known, KV unknown, context 8192", snap)
	}
	if st := w.State(); !strings.Contains(st.MetricsError, "max_batch_total_tokens") {
		t.Errorf("MetricsError = %q, want it to say why KV is unknown", st.MetricsError)
	}
}

func TestWorker_TRTLLM(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	fs.set("/metrics", 200, testdata(t, "trtllm_stats.json"))
	fs.set("/v1/models", 200, testdata(t, "trtllm_models.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "r", URL: srv.URL, Kind: KindTRTLLM})

	at := h.clock.Now()
	want := &snapshot.Snapshot{
		Health:     snapshot.HealthOK,
		Models:     []string{"TinyLlama/TinyLlama-1.1B-Chat-v1.0"},
		QueueLen:   snapshot.Reading{Value: 3, Source: "trtllm /metrics numQueuedRequests", At: at},
		KVPressure: snapshot.Reading{Value: 25314.0 / 101256.0, Source: "trtllm /metrics kvCacheStats.usedNumBlocks/maxNumBlocks", At: at},
	}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}

	// The next poll finds no new iteration: the readings keep their
	// time (and grow stale), they do not drop to zero.
	fs.set("/metrics", 200, "[]")
	h.clock.Advance(1)
	h.scrape(t, "r")
	if got := w.Snapshot().QueueLen; got.Value != 3 || !got.At.Equal(at) {
		t.Errorf("QueueLen after an empty poll = %+v, want the old reading", got)
	}
}

func TestWorker_Ollama(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/", 200, testdata(t, "ollama_root.txt"))
	fs.set("/api/ps", 200, testdata(t, "ollama_ps_context.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "o", URL: srv.URL, Kind: KindOllama, Models: []string{"llama3.2"}})

	snap := w.Snapshot()
	if diff := cmp.Diff([]string{"llama3.2", "gemma3", "qwen3:8b"}, snap.Models); diff != "" {
		t.Errorf("models: configured then loaded (-want +got):\n%s", diff)
	}
	if snap.Health != snapshot.HealthOK || snap.ContextTokens != 8192 {
		t.Errorf("snapshot %+v: want ok with context 8192", snap)
	}

	// Something else answers on the port.
	fs.set("/", 200, `{"status":"ok"}`)
	h.scrape(t, "o")
	if st := w.State(); st.ConsecutiveFailures != 1 || !strings.Contains(st.Reason, "Ollama is running") {
		t.Errorf("wrong server: %+v", st)
	}
}

func TestWorker_OllamaNothingLoadedNoConfigStaysUnknown(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/", 200, "Ollama is running")
	fs.set("/api/ps", 200, testdata(t, "ollama_ps_empty.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "o", URL: srv.URL, Kind: KindOllama})
	if got := w.Snapshot().Models; got != nil {
		t.Errorf("Models = %q, want nil (unknown): an idle Ollama may serve any pulled model", got)
	}
}

// TestWorker_LlamaCPPCurrentBuild serves the payloads of the llama-server
// in node-llama-cpp 3.22.1, which exports no KV-cache series: the worker
// has no telemetry error, logs no warning, and its KV pressure comes from
// /slots.
func TestWorker_LlamaCPPCurrentBuild(t *testing.T) {
	h := newHarness(t, Options{})
	fs := llamaServer(t)
	fs.set("/metrics", 200, testdata(t, "llamacpp_metrics_current.txt"))
	fs.set("/slots", 200, testdata(t, "llamacpp_slots_current.json"))
	fs.set("/props", 200, testdata(t, "llamacpp_props_current.json"))
	w := h.add(t, WorkerConfig{Name: "a", URL: serve(t, fs).URL, Kind: KindLlamaCPP})

	st := w.State()
	if st.MetricsError != "" || st.SlotsError != "" || st.PropsError != "" || st.LastError != "" {
		t.Errorf("telemetry errors: metrics %q slots %q props %q last %q", st.MetricsError, st.SlotsError, st.PropsError, st.LastError)
	}
	if n := h.logs.count("level=WARN"); n != 0 {
		t.Errorf("%d warnings logged:\n%s", n, h.logs)
	}
	at := h.clock.Now()
	want := snapshot.Reading{Value: 0.1875, Source: "llamacpp /slots n_prompt_tokens/n_ctx", At: at}
	if diff := cmp.Diff(want, w.Snapshot().KVPressure); diff != "" {
		t.Errorf("KVPressure mismatch (-want +got):\n%s", diff)
	}
	if got := w.Snapshot().QueueLen; got.Value != 1 {
		t.Errorf("QueueLen = %+v, want 1 from requests_deferred", got)
	}

	// An older build's kv_cache_usage_ratio in the same round wins.
	fs.set("/metrics", 200, testdata(t, "llamacpp_metrics.txt"))
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	if got := w.Snapshot().KVPressure; got.Value != 0.421875 || !strings.Contains(got.Source, "/metrics") {
		t.Errorf("KVPressure = %+v, want 0.421875 from /metrics", got)
	}
}
