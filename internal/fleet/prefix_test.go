package fleet

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/prefix/prefixtest"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// slotsBody is a /slots answer in the shape of a current llama-server run
// with LLAMA_SERVER_SLOTS_DEBUG=1: one entry per prompt ("" for a slot
// that never ran a task, which then has no prompt field).
func slotsBody(t *testing.T, prompts ...string) string {
	t.Helper()
	var out []map[string]any
	for i, p := range prompts {
		s := map[string]any{"id": i, "n_ctx": 8192, "speculative": false, "is_processing": i == 0}
		if p != "" {
			s["id_task"] = 100 + i
			s["prompt"] = p
			s["generated"] = "ok"
		}
		out = append(out, s)
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWorker_LlamaCPPSlotsReport(t *testing.T) {
	const bos = "<|begin_of_text|>"
	sys := strings.Repeat("You are a careful assistant. ", 40) // 2 router blocks and a bit
	other := strings.Repeat("Summarise the following report. ", 20)

	h := newHarness(t, Options{})
	fs := llamaServer(t)
	fs.set("/props", 200, `{"total_slots":3,"bos_token":"`+bos+`","default_generation_settings":{"n_ctx":8192}}`)
	fs.set("/slots", 200, slotsBody(t, bos+sys, bos+other, ""))
	// Every endpoint, /slots too, wants the worker's key.
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-worker" {
			http.Error(rw, `{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}`, http.StatusUnauthorized)
			return
		}
		fs.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(fs.release) })
	w := h.add(t, WorkerConfig{Name: "a", URL: srv.URL, Kind: KindLlamaCPP, APIKey: "sk-worker"})

	// The first round read /slots before /props told the BOS text: no
	// report yet rather than one with wrong blocks.
	if rep := w.Snapshot().CacheReport; rep != nil {
		t.Fatalf("report before /props was read: %+v", rep)
	}
	if got := w.Snapshot().KVCacheTokens; got != 8192 {
		t.Errorf("KVCacheTokens = %d, want a slot's n_ctx 8192", got)
	}

	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	rep := w.Snapshot().CacheReport
	if rep == nil {
		t.Fatal("no report from /slots with prompts")
	}
	want := map[uint64]struct{}{}
	for _, p := range []string{sys, other} {
		for _, hs := range prefix.Text(p, prefix.BlockBytes) {
			want[hs] = struct{}{}
		}
	}
	if rep.Source != "llama.cpp /slots" || !rep.At.Equal(h.clock.Now()) || rep.Slots != 2 || rep.NBlocks != len(want) || len(want) != 3 {
		t.Errorf("report %+v; want source llama.cpp /slots at %v, 2 slots, %d blocks", rep, h.clock.Now(), len(want))
	}
	if !maps.Equal(rep.Blocks, want) {
		t.Errorf("report blocks %v, want the router's blocks of the two prompts %v", slices.Sorted(maps.Keys(rep.Blocks)), slices.Sorted(maps.Keys(want)))
	}
	// The router's hashes of a request for the same raw prompt match.
	req := prefixtest.FromBody([]byte(`{"prompt":`+mustJSON(t, sys+"What next?")+`}`), prefix.BlockBytes)
	if got := rep.Match(req); got != 1 {
		t.Errorf("a request extending the held prompt matches %v, want 1 (%d blocks)", got, len(req))
	}
	if st := w.State(); st.CacheReport != rep || st.SlotsError != "" {
		t.Errorf("State: report %p (snapshot's %p), slots error %q", st.CacheReport, rep, st.SlotsError)
	}

	// A build that reports no prompts (the default of current ones):
	// no report, not an empty one.
	fs.set("/slots", 200, testdata(t, "llamacpp_slots.json"))
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	if rep := w.Snapshot().CacheReport; rep != nil {
		t.Errorf("report from /slots without prompts: %+v", rep)
	}

	// --no-slots after a report: the last report stays, growing old
	// (the scheduler sets it aside once stale), and the worker stays up.
	fs.set("/slots", 200, slotsBody(t, bos+sys))
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	at := h.clock.Now()
	fs.set("/slots", 501, `{"error":{"code":501,"message":"This server does not support slots endpoint. Start it with `+"`--slots`"+`","type":"not_supported_error"}}`)
	h.clock.Advance(time.Second)
	h.scrape(t, "a")
	st := w.State()
	if st.CacheReport == nil || !st.CacheReport.At.Equal(at) || !strings.Contains(st.SlotsError, "501") || st.Health != snapshot.HealthOK {
		t.Errorf("after a 501: report %+v (want the one of %v), slots error %q, health %v", st.CacheReport, at, st.SlotsError, st.Health)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWorker_VLLMPrefixCache(t *testing.T) {
	h := newHarness(t, Options{})
	fs := newFakeServer()
	fs.set("/health", 200, "")
	body := testdata(t, "vllm_metrics_prefix.txt")
	fs.set("/metrics", 200, body)
	fs.set("/v1/models", 200, `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-70B-Instruct","max_model_len":131072}]}`)
	srv := serve(t, fs)
	w := h.add(t, WorkerConfig{Name: "v", URL: srv.URL, Kind: KindVLLM})

	snap := w.Snapshot()
	if got, want := snap.KVCacheTokens, 2*29127*16; got != want {
		t.Errorf("KVCacheTokens = %d, want %d (num_gpu_blocks × block_size, two engines)", got, want)
	}
	if got, want := snap.KVPoolTokens, 29127*16; got != want {
		t.Errorf("KVPoolTokens = %d, want %d (one engine's: a request runs on one)", got, want)
	}
	if snap.PrefixHitRate.Known() {
		t.Errorf("a hit rate from one scrape: %+v", snap.PrefixHitRate)
	}
	if snap.CacheReport != nil {
		t.Errorf("vLLM reports no cache content, got %+v", snap.CacheReport)
	}

	// 10,000 more tokens looked up, 6,000 of them found.
	body = strings.Replace(body, `engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 120000.0`, `engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 130000.0`, 1)
	body = strings.Replace(body, `engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 90000.0`, `engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 96000.0`, 1)
	fs.set("/metrics", 200, body)
	h.clock.Advance(time.Second)
	h.scrape(t, "v")
	got := w.Snapshot().PrefixHitRate
	want := snapshot.Reading{Value: 0.6, Source: "vllm /metrics vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total", At: h.clock.Now()}
	if got != want {
		t.Errorf("PrefixHitRate = %+v, want %+v", got, want)
	}

	// A restart sets the counters back: no rate from across it, the
	// last one stays and grows old.
	fs.set("/metrics", 200, testdata(t, "vllm_metrics_prefix.txt"))
	h.clock.Advance(time.Second)
	h.scrape(t, "v")
	if got := w.Snapshot().PrefixHitRate; got != want {
		t.Errorf("after a counter reset PrefixHitRate = %+v, want the last one %+v", got, want)
	}
}

// TestWorker_LlamaCPPKVPool: a slot's n_ctx is taken for the KV cache the
// slots share only when the whole cache, as /metrics imply it, is no
// larger (a unified cache); a slot's share of a larger cache, or a build
// that does not say, leaves the pool unknown.
func TestWorker_LlamaCPPKVPool(t *testing.T) {
	metrics := func(used int, ratio float64) string {
		return fmt.Sprintf("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\nllamacpp:kv_cache_usage_ratio %g\nllamacpp:kv_cache_tokens %d\n", ratio, used)
	}
	for _, tc := range []struct {
		name    string
		metrics string
		nCtx    int
		want    int
	}{
		{name: "unified cache", metrics: metrics(3456, 0.421875), nCtx: 8192, want: 8192},
		{name: "a slot's share", metrics: metrics(3456, 0.421875), nCtx: 2048, want: 0},
		{name: "nothing in use yet", metrics: metrics(0, 0), nCtx: 8192, want: 0},
		{name: "newer build", metrics: "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n", nCtx: 8192, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			fs := llamaServer(t)
			fs.set("/metrics", 200, tc.metrics)
			fs.set("/slots", 200, fmt.Sprintf(`[{"id":0,"n_ctx":%d,"is_processing":true},{"id":1,"n_ctx":%d,"is_processing":false}]`, tc.nCtx, tc.nCtx))
			w := h.add(t, WorkerConfig{Name: "a", URL: serve(t, fs).URL, Kind: KindLlamaCPP})
			if got := w.Snapshot().KVPoolTokens; got != tc.want {
				t.Errorf("KVPoolTokens = %d, want %d", got, tc.want)
			}
		})
	}
}
