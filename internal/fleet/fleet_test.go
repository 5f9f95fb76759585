package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
)

func wantHealth(t *testing.T, w *Worker, want snapshot.Health) {
	t.Helper()
	if got := w.Snapshot().Health; got != want {
		t.Fatalf("%s: health = %v (%s), want %v", w.Name(), got, w.Snapshot().HealthReason, want)
	}
}

func TestWorker_LlamaCPPSnapshot(t *testing.T) {
	h := newHarness(t, Options{})
	srv := serve(t, llamaServer(t))
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})

	at := h.clock.Now()
	want := &snapshot.Snapshot{
		Health: snapshot.HealthOK,
		Models: []string{"llama-3.1-8b-instruct"},
		Slots:  4,
		// No /slots here: the context comes from /props.
		ContextTokens: 8192,
		QueueLen:      snapshot.Reading{Value: 5, Source: "llamacpp /metrics llamacpp:requests_deferred", At: at},
		KVPressure:    snapshot.Reading{Value: 0.421875, Source: "llamacpp /metrics llamacpp:kv_cache_usage_ratio", At: at},
	}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}
	st := w.State()
	if got, want := st.Running.Value, 2.0; got != want {
		t.Errorf("State().Running = %v, want %v", got, want)
	}
	if st.MetricsError != "" || st.LastError != "" {
		t.Errorf("errors in state: %+v", st)
	}
}

func TestWorker_InitialSnapshotIsUnknownNotNil(t *testing.T) {
	opts := (Options{}).withDefaults()
	w := newWorker(WorkerConfig{Name: "a", URL: "http://127.0.0.1:1", Kind: KindOpenAI}, &opts)
	s := w.Snapshot()
	if s == nil || s.Health != snapshot.HealthUnknown || s.Models != nil {
		t.Fatalf("initial snapshot = %+v, want unknown health and nil models", s)
	}
}

func TestWorker_DownEjectedAfterThresholdAndReadmitted(t *testing.T) {
	h := newHarness(t, Options{FailThreshold: 3, RiseThreshold: 2})
	fs := llamaServer(t)
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})
	wantHealth(t, w, snapshot.HealthOK)
	base := h.changes.count("a")

	fs.setMode("down")
	for i := 1; i <= 2; i++ {
		h.scrape(t, "a")
		wantHealth(t, w, snapshot.HealthOK)
		if got := w.State().ConsecutiveFailures; got != i {
			t.Fatalf("after %d failures: counter = %d", i, got)
		}
	}
	h.scrape(t, "a")
	wantHealth(t, w, snapshot.HealthDown)
	if r := w.Snapshot().HealthReason; !strings.Contains(r, srv.URL+"/health") {
		t.Errorf("reason %q does not name the probe URL", r)
	}
	if got := h.changes.count("a") - base; got != 1 {
		t.Errorf("OnChange calls on ejection = %d, want 1", got)
	}

	fs.setMode("up")
	h.scrape(t, "a")
	wantHealth(t, w, snapshot.HealthDown) // one pass is not enough
	h.scrape(t, "a")
	wantHealth(t, w, snapshot.HealthOK)
	if got := h.changes.count("a") - base; got != 2 {
		t.Errorf("OnChange calls after re-admission = %d, want 2", got)
	}
}

func TestWorker_RequestFailuresShareTheCounters(t *testing.T) {
	h := newHarness(t, Options{FailThreshold: 3, RiseThreshold: 1})
	fs := llamaServer(t)
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})

	// Two failed probes and one failed request eject, like three probes.
	fs.setMode("down")
	h.scrape(t, "a")
	h.scrape(t, "a")
	w.ReportRequest(context.Canceled) // the client left: not the worker's fault
	wantHealth(t, w, snapshot.HealthOK)
	w.ReportRequest(errors.New("connection reset by peer"))
	wantHealth(t, w, snapshot.HealthDown)
	if r := w.Snapshot().HealthReason; !strings.Contains(r, "connection reset") {
		t.Errorf("reason = %q, want the request error", r)
	}

	// A success in between resets the count.
	fs.setMode("up")
	h.scrape(t, "a")
	wantHealth(t, w, snapshot.HealthOK)
	w.ReportRequest(errors.New("HTTP 502"))
	w.ReportRequest(errors.New("HTTP 502"))
	w.ReportRequest(nil)
	w.ReportRequest(errors.New("HTTP 502"))
	wantHealth(t, w, snapshot.HealthOK)
	if got := w.State().ConsecutiveFailures; got != 1 {
		t.Errorf("consecutive failures = %d, want 1", got)
	}
}

func TestWorker_LoadingThenReady(t *testing.T) {
	h := newHarness(t, Options{})
	fs := llamaServer(t)
	fs.set("/health", 503, testdata(t, "llamacpp_health_loading.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP, Models: []string{"cfg-model"}})

	wantHealth(t, w, snapshot.HealthLoading)
	if r := w.Snapshot().HealthReason; !strings.Contains(r, "Loading model") {
		t.Errorf("reason = %q, want the server's words", r)
	}
	if got := fs.hitCount("/v1/models"); got != 0 {
		t.Errorf("/v1/models probed %d times while loading", got)
	}
	if w.Snapshot().Models != nil {
		t.Errorf("models = %v while loading, want nil (unknown)", w.Snapshot().Models)
	}
	// Loading is not a failure: it never ejects.
	for range 5 {
		h.scrape(t, "a")
	}
	wantHealth(t, w, snapshot.HealthLoading)

	fs.set("/health", 200, testdata(t, "llamacpp_health_ok.json"))
	h.scrape(t, "a")
	wantHealth(t, w, snapshot.HealthOK)
	if diff := cmp.Diff([]string{"llama-3.1-8b-instruct"}, w.Snapshot().Models); diff != "" {
		t.Errorf("models not read on becoming ready (-want +got):\n%s", diff)
	}
	if got := w.Snapshot().Slots; got != 4 {
		t.Errorf("slots = %d, want 4", got)
	}
}

func TestWorker_ModelsRefreshed(t *testing.T) {
	h := newHarness(t, Options{ModelRefresh: 30 * time.Second})
	fs := llamaServer(t)
	fs.set("/v1/models", 200, testdata(t, "llamacpp_models_router.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})
	if diff := cmp.Diff([]string{"qwen2.5-7b-instruct", "llama-3.2-3b"}, w.Snapshot().Models); diff != "" {
		t.Fatalf("models (-want +got):\n%s", diff)
	}
	base := h.changes.count("a")

	// gemma gets loaded, qwen unloaded.
	fs.set("/v1/models", 200, `{"object":"list","data":[`+
		`{"id":"qwen2.5-7b-instruct","object":"model","status":{"value":"unloaded"}},`+
		`{"id":"gemma-3-4b-it","object":"model","status":{"value":"loaded"}}]}`)
	h.clock.Advance(10 * time.Second)
	h.scrape(t, "a")
	if got := w.Snapshot().Models; !cmp.Equal(got, []string{"qwen2.5-7b-instruct", "llama-3.2-3b"}) {
		t.Errorf("models refreshed before ModelRefresh: %v", got)
	}
	h.clock.Advance(20 * time.Second)
	h.scrape(t, "a")
	if diff := cmp.Diff([]string{"gemma-3-4b-it"}, w.Snapshot().Models); diff != "" {
		t.Errorf("models after refresh (-want +got):\n%s", diff)
	}
	if got := h.changes.count("a") - base; got != 1 {
		t.Errorf("OnChange calls = %d, want 1", got)
	}
}

func TestWorker_KVPressureChangesSnapshot(t *testing.T) {
	h := newHarness(t, Options{})
	fs := llamaServer(t)
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})
	before := w.Snapshot()

	fs.set("/metrics", 200, strings.Replace(testdata(t, "llamacpp_metrics.txt"),
		"llamacpp:kv_cache_usage_ratio 0.421875", "llamacpp:kv_cache_usage_ratio 0.97", 1))
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	after := w.Snapshot()
	if got, want := after.KVPressure.Value, 0.97; got != want {
		t.Errorf("KV = %v, want %v", got, want)
	}
	if got, want := after.KVPressure.At, h.clock.Now(); !got.Equal(want) {
		t.Errorf("KV read at %v, want %v", got, want)
	}
	// The old snapshot is immutable.
	if got, want := before.KVPressure.Value, 0.421875; got != want {
		t.Errorf("published snapshot changed: KV = %v, want %v", got, want)
	}
}

func TestWorker_MalformedMetricsGoStaleHealthStaysOK(t *testing.T) {
	h := newHarness(t, Options{StaleAfter: 3 * time.Second})
	fs := llamaServer(t)
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})
	goodAt := h.clock.Now()

	fs.set("/metrics", 200, testdata(t, "llamacpp_metrics_malformed.txt"))
	for range 5 {
		h.clock.Advance(time.Second)
		h.scrape(t, "a")
	}
	wantHealth(t, w, snapshot.HealthOK)
	s := w.Snapshot()
	if !s.KVPressure.At.Equal(goodAt) || s.KVPressure.Value != 0.421875 {
		t.Errorf("KV = %+v, want the old reading from %v", s.KVPressure, goodAt)
	}
	st := w.State()
	if !strings.Contains(st.MetricsError, "line 6") {
		t.Errorf("MetricsError = %q, want the parser's line", st.MetricsError)
	}
	if diff := cmp.Diff([]string{"queue_len", "running", "kv_pressure"}, st.Stale); diff != "" {
		t.Errorf("stale readings (-want +got):\n%s", diff)
	}
	if got := h.logs.count("metrics unusable"); got != 1 {
		t.Errorf("logged the broken /metrics %d times over 5 rounds, want once:\n%s", got, h.logs)
	}

	// Partial metrics: what is there is fresh, the rest stays old.
	fs.set("/metrics", 200, testdata(t, "llamacpp_metrics_partial.txt"))
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	s = w.Snapshot()
	if got, want := s.KVPressure, (snapshot.Reading{Value: 0.9, Source: "llamacpp /metrics llamacpp:kv_cache_usage_ratio", At: h.clock.Now()}); !cmp.Equal(got, want) {
		t.Errorf("KV = %+v, want %+v", got, want)
	}
	if !s.QueueLen.At.Equal(goodAt) {
		t.Errorf("queue read at %v, want the old %v", s.QueueLen.At, goodAt)
	}
	if got := h.logs.count("metrics incomplete"); got != 1 {
		t.Errorf("logged partial /metrics %d times, want once", got)
	}

	fs.set("/metrics", 200, testdata(t, "llamacpp_metrics.txt"))
	h.scrape(t, "a")
	if st := w.State(); st.MetricsError != "" || len(st.Stale) != 0 {
		t.Errorf("after recovery: MetricsError %q, stale %v", st.MetricsError, st.Stale)
	}
	if got := h.logs.count("metrics recovered"); got != 1 {
		t.Errorf("logged recovery %d times, want once", got)
	}
}

func TestWorker_VLLMByModel(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	fs.set("/metrics", 200, testdata(t, "vllm_metrics.txt"))
	fs.set("/v1/models", 200, testdata(t, "vllm_models.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "v", URL: srv.URL, Kind: KindVLLM, Models: []string{"Qwen/Qwen2.5-7B-Instruct"}})

	at := h.clock.Now()
	want := &snapshot.Snapshot{
		Health: snapshot.HealthOK,
		Models: []string{"meta-llama/Llama-3.1-8B-Instruct", "sql-lora"},
		// /v1/models max_model_len.
		ContextTokens: 131072,
		QueueLen:      snapshot.Reading{Value: 0, Source: "vllm /metrics vllm:num_requests_waiting", At: at},
		KVPressure:    snapshot.Reading{Value: 0.125, Source: "vllm /metrics vllm:kv_cache_usage_perc", At: at},
		// The adapter card (parent set) is an adapter too.
		Adapters: []lora.Info{{Name: "sql-lora", Base: "meta-llama/Llama-3.1-8B-Instruct", Source: "vllm /v1/models"}},
	}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}

	fs.set("/health", 503, "")
	h.scrape(t, "v")
	if got := w.State().ConsecutiveFailures; got != 1 {
		t.Errorf("503 from vLLM /health: failures = %d, want 1", got)
	}
}

func TestWorker_OpenAIModelsOnly(t *testing.T) {
	h := newHarness(t, Options{FailThreshold: 1, RiseThreshold: 1})
	fs := newFakeServer()
	fs.set("/v1/models", 200, testdata(t, "openai_models.json"))
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "o", URL: srv.URL + "/", Kind: KindOpenAI})

	want := &snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"gpt-4o-mini", "text-embedding-3-small"}}
	if diff := cmp.Diff(want, w.Snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}
	if got := fs.hitCount("/health") + fs.hitCount("/metrics"); got != 0 {
		t.Errorf("probed /health or /metrics of an openai worker %d times", got)
	}
	fs.set("/v1/models", 401, `{"error":{"message":"bad key"}}`)
	h.scrape(t, "o")
	wantHealth(t, w, snapshot.HealthDown)
	if r := w.Snapshot().HealthReason; !strings.Contains(r, "HTTP 401") {
		t.Errorf("reason = %q", r)
	}
}

func TestWorker_DCGMSelectsGPU(t *testing.T) {
	h := newHarness(t, Options{})
	gpus := newFakeServer()
	gpus.set("/metrics", 200, testdata(t, "dcgm_metrics.txt"))
	gsrv := serve(t, gpus)
	srv := serve(t, llamaServer(t))

	w1 := h.add(t, WorkerConfig{Name: "gpu1", URL: srv.URL, Kind: KindLlamaCPP,
		GPUMetrics: gsrv.URL + "/metrics", GPUSelector: map[string]string{"gpu": "1"}})
	w0 := h.add(t, WorkerConfig{Name: "gpu0", URL: srv.URL, Kind: KindLlamaCPP,
		GPUMetrics: gsrv.URL + "/metrics", GPUSelector: map[string]string{"UUID": "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"}})
	wAny := h.add(t, WorkerConfig{Name: "ambiguous", URL: srv.URL, Kind: KindLlamaCPP, GPUMetrics: gsrv.URL + "/metrics"})

	at := h.clock.Now()
	if diff := cmp.Diff(snapshot.Reading{Value: 0.12, Source: `dcgm /metrics DCGM_FI_DEV_GPU_UTIL{gpu="1"}`, At: at}, w1.Snapshot().GPUUtil); diff != "" {
		t.Errorf("gpu1 (-want +got):\n%s", diff)
	}
	if got, want := w0.Snapshot().GPUUtil.Value, 0.93; got != want {
		t.Errorf("gpu0 util = %v, want %v", got, want)
	}
	if wAny.Snapshot().GPUUtil.Known() {
		t.Errorf("no selector over two GPUs: util = %+v, want unknown", wAny.Snapshot().GPUUtil)
	}
	if e := wAny.State().GPUError; !strings.Contains(e, "matches 2 GPUs") {
		t.Errorf("GPUError = %q", e)
	}
	wantHealth(t, wAny, snapshot.HealthOK)
}

func TestFleet_AddRemoveList(t *testing.T) {
	h := newHarness(t, Options{})
	srv := serve(t, llamaServer(t))
	h.add(t, WorkerConfig{Name: "b", URL: srv.URL, Kind: KindLlamaCPP})
	h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP})

	if _, err := h.f.Add(context.Background(), WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate Add: err = %v, want ErrExists", err)
	}
	var names []string
	for _, w := range h.f.List() {
		names = append(names, w.Name())
	}
	if diff := cmp.Diff([]string{"a", "b"}, names); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if err := h.f.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if h.f.Get("a") != nil {
		t.Error("Get after Remove returned the worker")
	}
	if err := h.f.Remove("a"); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("second Remove: err = %v, want ErrUnknownWorker", err)
	}
	h.f.Close()
	if _, err := h.f.Add(context.Background(), WorkerConfig{Name: "c", URL: srv.URL, Kind: KindLlamaCPP}); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: err = %v, want ErrClosed", err)
	}
}

func TestWorker_ConfigIsACopy(t *testing.T) {
	h := newHarness(t, Options{})
	srv := serve(t, llamaServer(t))
	cfg := WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP, Models: []string{"m"}}
	w := h.add(t, cfg)
	cfg.Models[0] = "changed"
	got := w.Config()
	got.Models[0] = "changed too"
	if m := w.Config().Models[0]; m != "m" {
		t.Errorf("config model = %q, want m", m)
	}
}
