package fleet

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/sim"
)

// llama.cpp's /lora-adapters names each file by the config's adapter of
// its path, else by its base name; a build without it has no adapter.
func TestWorker_LlamaCPPLoRA(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   []lora.Info
	}{
		{name: "golden", status: 200, body: testdata(t, "llamacpp_lora_adapters.json"), want: []lora.Info{
			{Name: "sql", Source: "llamacpp /lora-adapters id 0 scale 1"},
			{Name: "chat-lora", Source: "llamacpp /lora-adapters id 1 scale 0"},
		}},
		{name: "no endpoint", status: 404, body: `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			fs := newFakeServer()
			fs.set("/health", 200, testdata(t, "llamacpp_health_ok.json"))
			fs.set("/v1/models", 200, testdata(t, "llamacpp_models.json"))
			fs.set("/lora-adapters", tt.status, tt.body)
			srv := serve(t, fs)
			w := h.add(t, WorkerConfig{Name: "l", URL: srv.URL, Kind: KindLlamaCPP, AdapterPaths: map[string]string{"/adapters/sql-lora.gguf": "sql"}})
			if diff := cmp.Diff(tt.want, w.Snapshot().Adapters); diff != "" {
				t.Errorf("adapters (-want +got):\n%s", diff)
			}
			if e := w.State().LastError; e != "" {
				t.Errorf("last error %q", e)
			}
		})
	}
}

// LoadAdapter loads through vLLM's endpoint (the simulator's, over
// loopback), and the snapshot lists the adapter at once; a worker that
// cannot load, or an answer that is not a success, is an error.
func TestWorker_LoadAdapter(t *testing.T) {
	srv, err := sim.NewServer(sim.DefaultParams(), sim.Options{TimeScale: 1000, LoRA: &sim.LoRA{RuntimeLoading: true}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	<-srv.Ready()
	h := newHarness(t, Options{})
	w := h.add(t, WorkerConfig{Name: "v", URL: hs.URL, Kind: KindVLLM})
	ctx := context.Background()
	a := lora.Spec{Name: "sql", Base: srv.Params().Model, Path: "/a/sql"}
	if already, err := w.LoadAdapter(ctx, a); err != nil || already {
		t.Fatal(already, err)
	}
	if got := w.Snapshot().Adapters; len(got) != 1 || got[0].Name != "sql" {
		t.Fatalf("adapters after the load: %+v", got)
	}
	if already, err := w.LoadAdapter(ctx, a); err != nil || !already {
		t.Errorf("second load (vLLM: already loaded): %v %v, want success, already", already, err)
	}
	h.clock.Advance(time.Minute) // the model list is due again
	h.scrape(t, "v")
	if got := w.Snapshot().Adapters; len(got) != 1 || got[0].Name != "sql" || got[0].Source != "vllm /v1/models" {
		t.Errorf("adapters after a scrape: %+v, want sql from /v1/models", got)
	}
	if _, err := w.LoadAdapter(ctx, lora.Spec{Name: "x"}); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("load without a path: %v, want vLLM's 400", err)
	}
	l := h.add(t, WorkerConfig{Name: "l", URL: hs.URL, Kind: KindLlamaCPP})
	if _, err := l.LoadAdapter(ctx, a); err == nil || !strings.Contains(err.Error(), "cannot load") {
		t.Errorf("llama.cpp load: %v, want an error naming the kind", err)
	}
}
