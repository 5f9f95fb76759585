package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestAPIWorkers_DefaultIsWhatAnOperatorReads runs four simulated workers
// through enough requests for every internal (the latency model's
// matrix, per-level measurements, score terms) to exist, and checks that
// GET /api/workers answers with what an operator reads of each worker in
// a few kilobytes, and ?detail=1 with the internals.
func TestAPIWorkers_DefaultIsWhatAnOperatorReads(t *testing.T) {
	specs := sim.DemoFleet()
	fl := startFastSims(t, specs)
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = time.Hour // scraped below, when the test says
	cfg.Telemetry.Timeout = time.Second
	model := specs[0].Params.Model
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: "llamacpp", GPUMetrics: w.URL + "/dcgm/metrics"})
	}
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background())
	// Four at a time, so every worker serves some.
	for i := range 48 {
		done := make(chan struct{})
		go func() {
			defer close(done)
			body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":24,"ignore_eos":true,"messages":[{"role":"user","content":"hi %d"}]}`, model, i)
			readAll(t, post(t, context.Background(), r.url, body))
		}()
		if i%4 == 3 {
			<-done
		}
		defer func() { <-done }()
	}

	get := func(path string) (string, int) {
		resp, err := http.Get(r.url + path)
		if err != nil {
			t.Fatal(err)
		}
		return readAll(t, resp), resp.StatusCode
	}
	// Every request has ended (its stats recorded before its slot is
	// given back); a scrape now reads the workers' telemetry.
	waitFor(t, r, func() bool {
		for _, w := range r.srv.Scheduler().Workers() {
			if w.Active > 0 {
				return false
			}
		}
		return true
	})
	r.srv.ScrapeNow(context.Background())
	body, code := get("/api/workers")
	if code != http.StatusOK {
		t.Fatalf("GET /api/workers: %d %s", code, body)
	}
	var list struct {
		Workers []map[string]any `json:"workers"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if got, want := len(list.Workers), len(specs); got != want {
		t.Fatalf("/api/workers lists %d workers, want %d", got, want)
	}
	for _, w := range list.Workers {
		for _, k := range []string{"name", "url", "kind", "health", "draining", "models", "active", "limit", "limit_source", "limit_reason", "limit_cap",
			"queued", "worker_queue", "kv_pressure", "gpu_util", "ttft_ms", "decode_tok_s", "e2e_ms", "measured", "last_decision"} {
			if v, ok := w[k]; !ok || v == nil {
				t.Errorf("/api/workers: %v has no %s:\n%s", w["name"], k, body)
			}
		}
		for _, k := range []string{"stats", "telemetry", "last_terms", "probe", "learned_limit"} {
			if _, ok := w[k]; ok {
				t.Errorf("/api/workers: %v carries the internal %s; it belongs to ?detail=1", w["name"], k)
			}
		}
	}
	if got, limit := len(body), 1536*len(specs); got > limit {
		t.Errorf("/api/workers is %d bytes for %d workers, want at most %d:\n%s", got, len(specs), limit, body)
	}

	detail, code := get("/api/workers?detail=1")
	if code != http.StatusOK {
		t.Fatalf("GET /api/workers?detail=1: %d %s", code, detail)
	}
	var full struct {
		Workers []struct {
			Name      string          `json:"name"`
			LastTerms json.RawMessage `json:"last_terms"`
			Telemetry json.RawMessage `json:"telemetry"`
			Probe     json.RawMessage `json:"probe"`
			Stats     struct {
				Levels []json.RawMessage `json:"levels"`
				Fit    *struct {
					P []float64 `json:"p"`
				} `json:"fit"`
			} `json:"stats"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(detail), &full); err != nil {
		t.Fatal(err)
	}
	fits := 0
	for _, w := range full.Workers {
		if len(w.LastTerms) == 0 || len(w.Telemetry) == 0 || len(w.Probe) == 0 || len(w.Stats.Levels) == 0 {
			t.Errorf("?detail=1: %s lacks its internals (last_terms %d, telemetry %d, probe %d bytes, %d levels)", w.Name, len(w.LastTerms), len(w.Telemetry), len(w.Probe), len(w.Stats.Levels))
		}
		if w.Stats.Fit != nil && len(w.Stats.Fit.P) > 0 {
			fits++
		}
	}
	if fits == 0 {
		t.Errorf("?detail=1: no worker shows its latency model's fit:\n%.2000s", detail)
	}
	t.Logf("/api/workers %d bytes, ?detail=1 %d bytes", len(body), len(detail))

	if b, code := get("/api/workers?detail=yes"); code != http.StatusBadRequest || !strings.Contains(b, "detail") {
		t.Errorf("?detail=yes: %d %s, want 400 naming detail", code, b)
	}
}
