package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// Eight adapters over four simulated vLLM workers (real HTTP on
// loopback), one of which starts with two of them, with load on demand
// and max_replicas 2: no request reaches a worker without its adapter
// (the simulator would answer vLLM's 404), no adapter is loaded on more
// than two workers, and the loads are counted in
// sluice_lora_loads_total, listed in /v1/models with their parent and in
// /api/workers per worker, and named in the decision records.
func TestRouter_LoRAAdaptersOverLoopback(t *testing.T) {
	const nAdapters, nWorkers, maxReplicas = 8, 4, 2
	var sims []*sim.Server
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = 50 * time.Millisecond
	cfg.Telemetry.Timeout = time.Second
	cfg.Telemetry.StaleAfter = time.Second
	cfg.LoRA.LoadOnDemand, cfg.LoRA.MaxReplicas = true, maxReplicas
	for i := range nWorkers {
		lora := &sim.LoRA{RuntimeLoading: true}
		if i == 0 {
			lora.Adapters = []string{"a0", "a1"}
		}
		p := sim.DefaultParams()
		p.StartupDelay = 0
		srv, err := sim.NewServer(p, sim.Options{TimeScale: 50, Name: fmt.Sprintf("v%d", i), LoRA: lora})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(func() { srv.Close(); hs.Close() })
		<-srv.Ready()
		sims = append(sims, srv)
		cfg.Workers = append(cfg.Workers, config.Worker{Name: fmt.Sprintf("v%d", i), URL: hs.URL, Kind: "vllm", Models: []string{p.Model}, MaxConcurrency: 2})
	}
	base := sims[0].Params().Model
	for a := range nAdapters {
		cfg.LoRA.Adapters = append(cfg.LoRA.Adapters, config.LoRAAdapter{Name: fmt.Sprintf("a%d", a), Base: base, Path: fmt.Sprintf("/adapters/a%d", a)})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n = 96
	var wg sync.WaitGroup
	type answer struct {
		status   int
		body     string
		decision string
	}
	answers := make([]answer, n)
	sem := make(chan struct{}, 12) // more at once than the fleet's 8 slots
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"model":"a%d","max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"q %d"}]}`, i%nAdapters, i)
			resp := post(t, ctx, r.url, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = answer{resp.StatusCode, string(b), resp.Header.Get("X-Sluice-Decision")}
		})
	}
	wg.Wait()
	states := map[string]int{}
	for i, a := range answers {
		if a.status != http.StatusOK {
			t.Fatalf("request %d (a%d): %d %s", i, i%nAdapters, a.status, a.body)
		}
		rec, ok := r.srv.Decisions().Get(a.decision)
		if !ok || rec.Adapter == nil || rec.Adapter.Name != fmt.Sprintf("a%d", i%nAdapters) {
			t.Fatalf("request %d: record %v has adapter %+v", i, ok, rec.Adapter)
		}
		states[rec.Adapter.State]++
	}
	t.Logf("adapter states in the records: %v", states)
	if states["loaded"] == 0 || states["loading on demand"] == 0 {
		t.Errorf("records' adapter states %v: want both loaded and loading on demand", states)
	}

	holders := map[string]int{}
	loads := 0
	for _, s := range sims {
		names, l := s.LoRAAdapters()
		loads += l
		for _, a := range names {
			holders[a]++
		}
	}
	for a := range nAdapters {
		name := fmt.Sprintf("a%d", a)
		if h := holders[name]; h < 1 || h > maxReplicas {
			t.Errorf("%s on %d workers, want 1..%d", name, h, maxReplicas)
		}
	}
	t.Logf("holders %v, %d loads", holders, loads)

	// The loads are counted, per worker and adapter.
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	counted := 0
	for _, l := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(l, "sluice_lora_loads_total{") {
			var v int
			fmt.Sscanf(l[strings.LastIndexByte(l, ' ')+1:], "%d", &v)
			counted += v
		}
	}
	if counted != loads || loads == 0 || loads > nAdapters*maxReplicas {
		t.Errorf("sluice_lora_loads_total sums to %d, the workers loaded %d (want 1..%d)", counted, loads, nAdapters*maxReplicas)
	}

	// /v1/models lists every adapter with its parent.
	var ml struct {
		Data []struct{ ID, Parent string }
	}
	getJSON(t, r.url+"/v1/models", &ml)
	parents := 0
	for _, m := range ml.Data {
		if strings.HasPrefix(m.ID, "a") && m.Parent == base {
			parents++
		}
	}
	if parents != nAdapters {
		t.Errorf("/v1/models: %d adapters with parent %s, want %d: %+v", parents, base, nAdapters, ml.Data)
	}
	// /api/workers lists each worker's adapters.
	var wl struct {
		Workers []struct {
			Name     string
			Adapters []struct{ Name, State string }
		}
	}
	getJSON(t, r.url+"/api/workers", &wl)
	listed := 0
	for _, w := range wl.Workers {
		listed += len(w.Adapters)
	}
	want := 0
	for _, h := range holders {
		want += h
	}
	if listed != want {
		t.Errorf("/api/workers lists %d adapters, the workers hold %d", listed, want)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}
