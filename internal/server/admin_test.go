package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// newTelemetryWorker starts a loopback worker answering the probes of
// both kinds the tests use: /health, /v1/models for model "m", /props when
// props is set (llama.cpp's; vLLM has none), /metrics from metrics, and a
// one-token chat completion.
func newTelemetryWorker(t *testing.T, props string, metrics func() string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
			io.WriteString(rw, `{"status":"ok"}`)
		case r.URL.Path == "/props" && props != "":
			io.WriteString(rw, props)
		case r.URL.Path == "/v1/models":
			io.WriteString(rw, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case r.URL.Path == "/metrics":
			io.WriteString(rw, metrics())
		case r.URL.Path == "/v1/chat/completions":
			rw.Header().Set("Content-Type", "application/json")
			io.WriteString(rw, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}`)
		default:
			http.NotFound(rw, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// llamaWorker is a loopback server answering llama.cpp's probes, with a
// KV-cache usage the test sets.
type llamaWorker struct {
	srv *httptest.Server
	kv  atomic.Value // string, e.g. "0.5"
}

func newLlamaWorker(t *testing.T) *llamaWorker {
	w := &llamaWorker{}
	w.kv.Store("0")
	w.srv = newTelemetryWorker(t, `{"total_slots":4,"model_path":"m.gguf"}`, func() string {
		return fmt.Sprintf("# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio %s\n# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n# HELP llamacpp:requests_deferred Number of requests deferred.\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n", w.kv.Load())
	})
	return w
}

func TestRouter_KVPressureChangeChangesThePick(t *testing.T) {
	a, b := newLlamaWorker(t), newLlamaWorker(t)
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = 1 << 40 // probe rounds only when the test asks
	cfg.Telemetry.StaleAfter = 1 << 41
	cfg.Workers = []config.Worker{{Name: "a", URL: a.srv.URL, Kind: "llamacpp"}, {Name: "b", URL: b.srv.URL, Kind: "llamacpp"}}
	r := startRouter(t, cfg)
	n := 0
	pick := func() string {
		n++ // a user of its own each time: a shared user field is a session hint
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint("x", n), false))
		readAll(t, resp)
		return resp.Header.Get("X-Sluice-Worker")
	}
	a.kv.Store("0.9")
	b.kv.Store("0.1")
	r.srv.ScrapeNow(context.Background())
	if got := pick(); got != "b" {
		t.Fatalf("picked %s with a at 90%% KV and b at 10%%", got)
	}
	a.kv.Store("0.1")
	b.kv.Store("0.9")
	r.srv.ScrapeNow(context.Background())
	if got := pick(); got != "a" {
		t.Fatalf("picked %s after KV pressure moved to b", got)
	}
}

func TestRouter_AdminAddDrainRemoveAndReload(t *testing.T) {
	w0, w1 := newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")
	cfg := testConfig(t, []*fakeWorker{w0}, nil)
	r := startRouter(t, cfg)
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, r.url+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	served := func() string {
		resp := post(t, context.Background(), r.url, chat("x", false))
		readAll(t, resp)
		return resp.Header.Get("X-Sluice-Worker")
	}

	if code, body := do("POST", "/api/workers", `{"name":"gpu1","url":"`+w1.srv.URL+`","kind":"openai","models":["m"],"max_concurrency":1}`); code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	if code, body := do("POST", "/api/workers", `{"name":"gpu1","url":"`+w1.srv.URL+`"}`); code != 400 || !strings.Contains(body, "already exists") {
		t.Fatalf("duplicate add: %d %s", code, body)
	}
	if code, body := do("POST", "/api/workers", `{"name":"bad","url":"ftp://x"}`); code != 400 || !strings.Contains(body, "url") {
		t.Fatalf("bad add: %d %s", code, body)
	}
	if code, body := do("POST", "/api/workers", `{"name":"bad","url":"127.0.0.1:19081"}`); code != 400 || !strings.Contains(body, `url: \"127.0.0.1:19081\" has no scheme; add http:// (or https://)`) {
		t.Fatalf("add without a scheme: %d %s", code, body)
	}
	if code, _ := do("POST", "/api/workers/gpu0/drain", ""); code != 200 {
		t.Fatalf("drain: %d", code)
	}
	for range 3 {
		if got := served(); got != "gpu1" {
			t.Fatalf("served by %s while gpu0 drains", got)
		}
	}
	if code, _ := do("DELETE", "/api/workers/gpu1", ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if code, body := do("DELETE", "/api/workers/gpu1", ""); code != 404 {
		t.Fatalf("second delete: %d %s", code, body)
	}
	do("POST", "/api/workers/gpu0/undrain", "")
	if got := served(); got != "gpu0" {
		t.Fatalf("served by %s after undrain", got)
	}

	// Reload: gpu0 removed, gpu1 added.
	next := testConfig(t, []*fakeWorker{w1}, nil)
	if err := r.srv.Reload(next); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := served(); got != "gpu1" {
			t.Fatalf("served by %s after reload to gpu1 only", got)
		}
	}
	if ws := r.srv.Scheduler().Workers(); len(ws) != 1 || ws[0].Name != "gpu1" {
		t.Fatalf("workers after reload: %+v", ws)
	}
}

func TestChangedNonWorkerKeys(t *testing.T) {
	a := config.DefaultConfig()
	b := a
	b.Admission.MaxQueue = 7
	b.Workers = []config.Worker{{Name: "x"}}
	if got := changedNonWorkerKeys(a, b); len(got) != 1 || got[0] != "admission" {
		t.Fatalf("changed %v, want [admission]", got)
	}
	if got := changedNonWorkerKeys(a, a); len(got) != 0 {
		t.Fatalf("changed %v for identical configs", got)
	}
}

// TestRouter_AdminAddConcurrentWithReload runs the admin API's add and
// config reloads at once; the race detector checks they share the config
// safely, and every add either lands or is refused cleanly.
func TestRouter_AdminAddConcurrentWithReload(t *testing.T) {
	w0, w1 := newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")
	r := startRouter(t, testConfig(t, []*fakeWorker{w0}, nil))
	configs := []config.Config{testConfig(t, []*fakeWorker{w0}, nil), testConfig(t, []*fakeWorker{w1}, nil)}
	const n = 20
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			body := fmt.Sprintf(`{"name":"extra%d","url":%q,"kind":"openai","models":["m"]}`, i, w1.srv.URL)
			resp, err := http.Post(r.url+"/api/workers", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			if text := readAll(t, resp); resp.StatusCode != http.StatusCreated {
				t.Errorf("add extra%d: %d %s", i, resp.StatusCode, text)
			}
		}
	})
	for i := range n {
		if err := r.srv.Reload(configs[i%2]); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}

// A reload that changes a worker's settings keeps counting the requests in
// flight on it: it must not admit a fresh batch next to the old leases.
func TestRouter_ReloadKeepsInFlightCounts(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	fixed := func(limit int) func(*config.Config) {
		return func(c *config.Config) {
			c.Limits.Learning.Fixed = true
			c.Workers[0].MaxConcurrency = config.Concurrency(limit)
		}
	}
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, fixed(2)))
	sched := r.srv.Scheduler()
	held, err := sched.Admit(context.Background(), scheduler.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if err := r.srv.Reload(testConfig(t, []*fakeWorker{w}, fixed(1))); err != nil {
		t.Fatal(err)
	}
	ws := sched.Workers()
	if len(ws) != 1 || ws[0].Active != 1 || ws[0].Limit != 1 {
		t.Fatalf("after the reload: %+v; want gpu0 with 1 in flight at limit 1", ws)
	}
	tk := sched.Submit(scheduler.Request{Model: "m"}, nil)
	if tk.Done() {
		l, err := tk.Result()
		t.Fatalf("bound %v %v next to the in-flight request at limit 1", l, err)
	}
	held.Release() // the old lease frees the slot for the waiting one
	l, err := tk.Result()
	if !tk.Done() || err != nil || l.Worker != "gpu0" {
		t.Fatalf("waiting request after the old lease ended: done %v, %v %v", tk.Done(), l, err)
	}
	l.Release()
}
