package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// newTestServer starts a simulated worker behind an httptest server.
func newTestServer(t *testing.T, p Params, scale float64) (*Server, *httptest.Server) {
	t.Helper()
	srv, err := NewServer(p, Options{TimeScale: scale, Name: "test"})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		srv.Close() // first, so streams in flight end
		hs.Close()
	})
	<-srv.Ready()
	return srv, hs
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

func decodeBody(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode body: %v", err)
	}
}

// sseEvents reads every "data:" payload of an SSE stream.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return out
}

type openAIUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type openAIChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

func TestServer_StreamingIsOpenAIChunks(t *testing.T) {
	tests := []struct {
		name, path, body string
		object           string
		wantPrompt       int
	}{
		{"chat", "/v1/chat/completions",
			`{"model":"m","stream":true,"max_tokens":20,"ignore_eos":true,"messages":[{"role":"user","content":"abcdefghijklmnop"}]}`,
			"chat.completion.chunk", estimateTokens(len("user") + 16)},
		{"completions", "/v1/completions",
			`{"model":"m","stream":true,"max_tokens":20,"ignore_eos":true,"prompt":"abcdefgh"}`,
			"text_completion", 2},
	}
	_, hs := newTestServer(t, testParams(), 1000)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, hs.URL+tt.path, tt.body)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("Content-Type %q", ct)
			}
			events := sseEvents(t, resp.Body)
			if got := events[len(events)-1]; got != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", got)
			}
			var text strings.Builder
			var last openAIChunk
			for i, ev := range events[:len(events)-1] {
				var c openAIChunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("event %d %q: %v", i, ev, err)
				}
				if c.Object != tt.object || len(c.Choices) != 1 || c.ID == "" || c.Model != "llama-3-8b-instruct" {
					t.Fatalf("event %d not an OpenAI chunk: %s", i, ev)
				}
				text.WriteString(c.Choices[0].Delta.Content + c.Choices[0].Text)
				last = c
			}
			if got, want := len(events), 20+2; got != want {
				t.Fatalf("%d events, want one per token plus final and [DONE] = %d", got, want)
			}
			if fr := last.Choices[0].FinishReason; fr == nil || *fr != "length" {
				t.Fatalf("final finish_reason = %v, want length", fr)
			}
			want := &openAIUsage{PromptTokens: tt.wantPrompt, CompletionTokens: 20, TotalTokens: tt.wantPrompt + 20}
			if diff := cmp.Diff(want, last.Usage); diff != "" {
				t.Fatalf("usage (-want +got):\n%s", diff)
			}
			if text.Len() == 0 {
				t.Fatal("no streamed text")
			}
		})
	}
}

func TestServer_NonStreaming(t *testing.T) {
	_, hs := newTestServer(t, testParams(), 1000)
	t.Run("chat", func(t *testing.T) {
		var body struct {
			Object  string `json:"object"`
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct{ Role, Content string }
			} `json:"choices"`
			Usage openAIUsage `json:"usage"`
		}
		decodeBody(t, post(t, hs.URL+"/v1/chat/completions",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":7,"ignore_eos":true,"sim_prompt_tokens":300}`), &body)
		if body.Object != "chat.completion" || body.Choices[0].Message.Role != "assistant" || body.Choices[0].Message.Content == "" {
			t.Fatalf("body %+v", body)
		}
		if diff := cmp.Diff(openAIUsage{300, 7, 307}, body.Usage); diff != "" {
			t.Fatalf("usage (-want +got):\n%s", diff)
		}
	})
	t.Run("native", func(t *testing.T) {
		var body struct {
			Content         string `json:"content"`
			Stop            bool   `json:"stop"`
			StopType        string `json:"stop_type"`
			TokensPredicted int    `json:"tokens_predicted"`
			TokensEvaluated int    `json:"tokens_evaluated"`
			Timings         struct {
				PromptN            int     `json:"prompt_n"`
				PredictedN         int     `json:"predicted_n"`
				PredictedPerSecond float64 `json:"predicted_per_second"`
			} `json:"timings"`
		}
		decodeBody(t, post(t, hs.URL+"/completion", `{"prompt":[1,2,3,4,5],"n_predict":9,"ignore_eos":true}`), &body)
		if !body.Stop || body.StopType != "limit" || body.TokensPredicted != 9 || body.TokensEvaluated != 5 || body.Content == "" {
			t.Fatalf("body %+v", body)
		}
		// Alone, decode runs at 1/(10ms+1ms) = 90.9 tokens/s of model time.
		if body.Timings.PromptN != 5 || body.Timings.PredictedN != 9 || body.Timings.PredictedPerSecond < 90 || body.Timings.PredictedPerSecond > 92 {
			t.Fatalf("timings %+v", body.Timings)
		}
	})
	t.Run("native stream", func(t *testing.T) {
		resp := post(t, hs.URL+"/completion", `{"prompt":"hello","n_predict":4,"stream":true}`)
		defer resp.Body.Close()
		events := sseEvents(t, resp.Body)
		var last struct {
			Stop            bool `json:"stop"`
			TokensPredicted int  `json:"tokens_predicted"`
		}
		if err := json.Unmarshal([]byte(events[len(events)-1]), &last); err != nil {
			t.Fatalf("last event %q: %v", events[len(events)-1], err)
		}
		if !last.Stop || last.TokensPredicted != len(events)-1 || last.TokensPredicted > 4 {
			t.Fatalf("native stream ended with %+v after %d events", last, len(events))
		}
	})
}

func TestServer_BadInput(t *testing.T) {
	p := testParams()
	p.KVTokens = 100
	_, hs := newTestServer(t, p, 1000)
	tests := []struct {
		name, path, body string
		status           int
		typ              string
	}{
		{"not json", "/v1/chat/completions", `{`, 400, "invalid_request_error"},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, 400, "invalid_request_error"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request_error"},
		{"message without role", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "invalid_request_error"},
		{"bad content", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "invalid_request_error"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, 400, "invalid_request_error"},
		{"bad prompt", "/completion", `{"prompt":{"a":1}}`, 400, "invalid_request_error"},
		{"negative limit", "/completion", `{"prompt":"x","n_predict":-5}`, 400, "invalid_request_error"},
		{"prompt too long", "/completion", `{"prompt":"x","sim_prompt_tokens":500}`, 400, "exceed_context_size_error"},
		{"unknown path", "/v2/whatever", `{}`, 404, "not_found_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, hs.URL+tt.path, tt.body)
			var body struct {
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			decodeBody(t, resp, &body)
			if resp.StatusCode != tt.status || body.Error.Code != tt.status || body.Error.Type != tt.typ || body.Error.Message == "" {
				t.Fatalf("status %d, error %+v; want %d %s", resp.StatusCode, body.Error, tt.status, tt.typ)
			}
		})
	}
}

// scrape fetches and parses a Prometheus text endpoint.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	out := map[string]float64{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				out[name] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// waitMetrics scrapes until cond holds; the server changes state on its
// own goroutine, so this is the condition the test synchronises on.
func waitMetrics(t *testing.T, url string, what string, cond func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := scrape(t, url)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last metrics %v", what, m)
		}
	}
}

func TestServer_MetricsReflectStateAndDisconnectFreesSlot(t *testing.T) {
	p := testParams()
	p.Slots = 1
	srv, hs := newTestServer(t, p, 1) // real time: the long request stays running
	metricsURL := hs.URL + "/metrics"

	m := scrape(t, metricsURL)
	for _, name := range []string{
		"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
		"llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode",
		"llamacpp:n_tokens_max", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
		"llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens", "llamacpp:requests_processing",
		"llamacpp:requests_deferred",
	} {
		if _, ok := m[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	// A: a long streaming request that holds the only slot.
	ctx, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"max_tokens":100000,"ignore_eos":true,"sim_prompt_tokens":1000,"messages":[{"role":"user","content":"x"}]}`))
	respA, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer respA.Body.Close()
	// Its first event proves it is running.
	br := bufio.NewReader(respA.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line of A %q, %v", line, err)
	}

	// B: queued behind A.
	bDone := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"abcd","max_tokens":3,"ignore_eos":true}`))
		if err != nil {
			bDone <- nil
			return
		}
		bDone <- resp
	}()
	m = waitMetrics(t, metricsURL, "B deferred", func(m map[string]float64) bool { return m["llamacpp:requests_deferred"] == 1 })
	if got := m["llamacpp:requests_processing"]; got != 1 {
		t.Fatalf("requests_processing = %v with A running, want 1", got)
	}
	if kv := m["llamacpp:kv_cache_tokens"]; kv < 1000 {
		t.Fatalf("kv_cache_tokens = %v, want A's 1000-token prompt and more", kv)
	}
	if r := m["llamacpp:kv_cache_usage_ratio"]; r <= 0 || r > 1 {
		t.Fatalf("kv_cache_usage_ratio = %v", r)
	}
	if m["llamacpp:prompt_tokens_total"] < 1000 || m["llamacpp:n_decode_total"] < 1 {
		t.Fatalf("counters did not move: %v", m)
	}

	// The client of A goes away: its slot and KV go to B at once.
	cancelA()
	resp := <-bDone
	if resp == nil {
		t.Fatal("B failed")
	}
	var body struct{ Usage openAIUsage }
	decodeBody(t, resp, &body)
	if body.Usage.CompletionTokens != 3 {
		t.Fatalf("B usage %+v", body.Usage)
	}
	m = waitMetrics(t, metricsURL, "idle", func(m map[string]float64) bool {
		return m["llamacpp:requests_processing"] == 0 && m["llamacpp:requests_deferred"] == 0
	})
	if m["llamacpp:kv_cache_tokens"] != 0 {
		t.Fatalf("KV not freed: %v", m["llamacpp:kv_cache_tokens"])
	}
	if got := srv.Metrics().Cancelled; got != 1 {
		t.Fatalf("engine counted %d cancellations, want 1", got)
	}
}

func TestServer_HealthLoadingThenOK(t *testing.T) {
	p := testParams()
	p.StartupDelay = 5 * time.Second
	srv, err := NewServer(p, Options{TimeScale: 10}) // loads in 0.5 s of real time
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer func() { srv.Close(); hs.Close() }()

	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	code, body := get("/health")
	if want := `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`; code != 503 || body != want {
		t.Fatalf("/health while loading = %d %s, want 503 %s", code, body, want)
	}
	if code, _ := get("/v1/chat/completions"); code != 503 {
		t.Fatalf("completions while loading = %d, want 503", code)
	}
	if code, _ := get("/v1/models"); code != 200 {
		t.Fatalf("/v1/models while loading = %d, want 200 (llama-server allows it)", code)
	}
	<-srv.Ready()
	if code, body := get("/health"); code != 200 || body != `{"status":"ok"}` {
		t.Fatalf("/health after loading = %d %s", code, body)
	}
}

func TestServer_DCGMGauge(t *testing.T) {
	_, hs := newTestServer(t, testParams(), 1000)
	resp, err := http.Get(hs.URL + "/dcgm/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	mf, ok := fams["DCGM_FI_DEV_GPU_UTIL"]
	if !ok || len(mf.GetMetric()) != 1 {
		t.Fatalf("no DCGM_FI_DEV_GPU_UTIL in %v", fams)
	}
	labels := map[string]string{}
	for _, lp := range mf.GetMetric()[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	for _, l := range []string{"gpu", "UUID", "modelName", "Hostname", "device"} {
		if labels[l] == "" {
			t.Errorf("label %s missing: %v", l, labels)
		}
	}
	if !strings.HasPrefix(labels["UUID"], "GPU-") {
		t.Errorf("UUID %q", labels["UUID"])
	}
	if v := mf.GetMetric()[0].GetGauge().GetValue(); v < 0 || v > 100 {
		t.Fatalf("utilisation %v outside 0..100", v)
	}
	// llama.cpp's /metrics is untouched by it.
	if _, ok := scrape(t, hs.URL+"/metrics")["DCGM_FI_DEV_GPU_UTIL"]; ok {
		t.Fatal("DCGM gauge leaked into llama.cpp's /metrics")
	}
}

func TestServer_PropsSlotsModels(t *testing.T) {
	p := testParams()
	p.Slots = 3
	_, hs := newTestServer(t, p, 1000)
	get := func(path string, v any) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		decodeBody(t, resp, v)
	}
	var props struct {
		TotalSlots int `json:"total_slots"`
		Settings   struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	get("/props", &props)
	if props.TotalSlots != 3 || props.Settings.NCtx != p.KVTokens {
		t.Fatalf("props %+v", props)
	}
	var slots []struct {
		ID           int  `json:"id"`
		IsProcessing bool `json:"is_processing"`
	}
	get("/slots", &slots)
	if len(slots) != 3 || slots[2].ID != 2 || slots[0].IsProcessing {
		t.Fatalf("slots %+v", slots)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	get("/v1/models", &models)
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != p.Model {
		t.Fatalf("models %+v", models)
	}
}

func TestFleet_StartsWorkersOnPorts(t *testing.T) {
	specs := DemoFleet()
	for i := range specs {
		specs[i].Params.StartupDelay = 0
		specs[i].TimeScale = 1000
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := StartFleet(ctx, specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	urls := f.URLs()
	if len(urls) != 4 {
		t.Fatalf("URLs %v", urls)
	}
	for i, w := range f.Workers() {
		<-w.Server.Ready()
		resp, err := http.Get(urls[i] + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s /health = %d", w.Name, resp.StatusCode)
		}
	}
	cancel()
	f.Close() // idempotent after the context closed it
	if _, err := http.Get(urls[0] + "/health"); err == nil {
		t.Fatal("worker still serving after Close")
	}
}

func TestDemoFleet_IsHeterogeneous(t *testing.T) {
	specs := DemoFleet()
	if len(specs) != 4 {
		t.Fatalf("%d workers", len(specs))
	}
	var slow, smallKV int
	for _, s := range specs {
		if s.Params.Model != "llama-3-8b-instruct" {
			t.Errorf("%s serves %q", s.Name, s.Params.Model)
		}
		if err := s.Params.Validate(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		if s.Params.Speed < 1 {
			slow++
		}
		if s.Params.KVTokens < DefaultParams().KVTokens {
			smallKV++
		}
	}
	if slow != 1 || smallKV != 1 {
		t.Fatalf("slow cards %d, small caches %d; want one each", slow, smallKV)
	}
}

func TestParseFleet(t *testing.T) {
	yamlOK := `
time_scale: 5
workers:
  - name: a
  - name: b
    speed: 0.6
    kv_tokens: 8192
    startup_delay: 30s
    time_scale: 2
    kv_events: 127.0.0.1:0
`
	specs, err := ParseFleet([]byte(yamlOK), false)
	if err != nil {
		t.Fatal(err)
	}
	want0 := DefaultParams()
	want0.Seed = 1
	if diff := cmp.Diff(WorkerSpec{Name: "a", Params: want0, TimeScale: 5}, specs[0]); diff != "" {
		t.Fatalf("worker a (-want +got):\n%s", diff)
	}
	if b := specs[1]; b.Params.Speed != 0.6 || b.Params.KVTokens != 8192 || b.Params.StartupDelay != 30*time.Second || b.TimeScale != 2 || b.KVEvents != "127.0.0.1:0" {
		t.Fatalf("worker b %+v", b)
	}

	jsonSpecs, err := ParseFleet([]byte(`{"workers":[{"name":"j","slots":2,"decode_base":"20ms"}]}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if p := jsonSpecs[0].Params; p.Slots != 2 || p.DecodeBase != 20*time.Millisecond {
		t.Fatalf("json worker %+v", p)
	}

	bad := []struct {
		name, doc string
		json      bool
		want      []string
	}{
		{"unknown yaml key", "workers:\n  - name: a\n    gpus: 2\n", false, []string{"gpus"}},
		{"unknown json key", `{"workers":[{"nmae":"a"}]}`, true, []string{"nmae"}},
		{"no workers", "time_scale: 1\n", false, []string{"workers"}},
		{"kv events", "workers:\n  - kv_events: tcp://x\n  - kv_events_replay: 127.0.0.1:0\n", false, []string{"workers[0].kv_events", "workers[1].kv_events_replay: set without kv_events"}},
		{"every problem", "workers:\n  - slots: 0\n    speed: -1\n    startup_delay: soon\n  - name: sim-0\n", false,
			[]string{"workers[0].slots", "workers[0].speed", "workers[0].startup_delay", "workers[1].name"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFleet([]byte(tt.doc), tt.json)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}

	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(yamlOK), 0o600); err != nil {
		t.Fatal(err)
	}
	if specs, err := ParseFleetFile(path); err != nil || len(specs) != 2 {
		t.Fatalf("ParseFleetFile = %v, %v", specs, err)
	}
	if _, err := ParseFleetFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}

// FuzzParseGenRequest checks the request parser never panics and never
// yields an unusable request.
func FuzzParseGenRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"prompt":[1,2,[3,4]],"n_predict":-1}`,
		`{"prompt":"x","sim_prompt_tokens":7,"stream":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, k := range []genKind{kindChat, kindCompletions, kindNative} {
			g, err := parseGenRequest(k, strings.NewReader(body), "")
			if err != nil {
				continue
			}
			if g.req.PromptTokens < 1 || g.req.MaxTokens < 0 {
				t.Fatalf("kind %d body %q: unusable request %+v", k, body, g.req)
			}
		}
	})
}

func ExampleDemoFleet() {
	for _, w := range DemoFleet() {
		fmt.Printf("%s speed=%.1f kv=%d\n", w.Name, w.Params.Speed, w.Params.KVTokens)
	}
	// Output:
	// gpu-0 speed=1.0 kv=32768
	// gpu-1 speed=1.0 kv=32768
	// gpu-2-slow speed=0.6 kv=32768
	// gpu-3-small-kv speed=1.0 kv=8192
}
