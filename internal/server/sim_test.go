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
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRouter_InFrontOfSimulatedFleet runs the router against simulated
// llama-servers, scraped through the same code as real ones, and checks
// that decisions come to use live telemetry and measured averages.
func TestRouter_InFrontOfSimulatedFleet(t *testing.T) {
	specs := sim.DemoFleet()[:2]
	fl := startFastSims(t, specs)
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = 20 * time.Millisecond
	cfg.Telemetry.Timeout = time.Second
	cfg.Telemetry.StaleAfter = time.Second
	model := specs[0].Params.Model
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: "llamacpp", GPUMetrics: w.URL + "/dcgm/metrics"})
	}
	r := startRouter(t, cfg)

	var first, last *decisions.Record
	for i := range 40 {
		stream := i%2 == 0
		body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":20,"ignore_eos":true,"messages":[{"role":"user","content":"hi %d"}]}`, model, stream, i)
		resp := post(t, context.Background(), r.url, body)
		text := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, text)
		}
		if stream && !strings.Contains(text, "data: [DONE]") {
			t.Fatalf("stream %d did not end with [DONE]: %q", i, text)
		}
		if !stream {
			var ans struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(text), &ans); err != nil || ans.Usage.CompletionTokens != 20 {
				t.Fatalf("answer %d: usage %+v err %v", i, ans.Usage, err)
			}
		}
		rec, ok := r.srv.Decisions().Get(resp.Header.Get("X-Sluice-Decision"))
		if !ok {
			t.Fatalf("request %d: no decision record", i)
		}
		rec.Explain()
		if first == nil {
			first = rec
		}
		last = rec
		if hasTerm(rec, "kv_pressure", "llamacpp") && hasTerm(rec, "gpu_util", "DCGM") && hasTerm(rec, "latency", "over") {
			break
		}
	}
	if !hasNeutral(first, "latency") {
		t.Errorf("first decision's latency term is not neutral: there was no history yet")
	}
	for _, term := range []struct{ name, source string }{{"kv_pressure", "llamacpp"}, {"gpu_util", "DCGM"}, {"latency", "over"}, {"throughput", "over"}} {
		if !hasTerm(last, term.name, term.source) {
			t.Errorf("after 40 requests no decision used %s from %q: %+v", term.name, term.source, last.Candidates)
		}
	}
	// The worker the router knows is healthy, with slots read from /props.
	resp, err := http.Get(r.url + "/api/workers")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"health": "ok"`) || !strings.Contains(body, fmt.Sprintf(`"limit_cap": %d`, specs[0].Params.Slots)) {
		t.Errorf("/api/workers does not show a healthy worker with %d slots:\n%s", specs[0].Params.Slots, body)
	}
}

func hasTerm(r *decisions.Record, name, source string) bool {
	for _, c := range r.Candidates {
		for _, t := range c.Terms {
			if t.Name == name && strings.Contains(t.Source, source) && !t.Neutral {
				return true
			}
		}
	}
	return false
}

func hasNeutral(r *decisions.Record, name string) bool {
	for _, c := range r.Candidates {
		for _, t := range c.Terms {
			if t.Name == name && t.Neutral {
				return true
			}
		}
	}
	return false
}

// startFastSims starts simulated llama-servers for specs on loopback, 50×
// faster than real time and with no startup delay, closed when the test
// ends.
func startFastSims(t *testing.T, specs []sim.WorkerSpec) *sim.Fleet {
	t.Helper()
	for i := range specs {
		specs[i].TimeScale = 50
		specs[i].Params.StartupDelay = 0
	}
	fl, err := sim.StartFleet(context.Background(), specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Close)
	return fl
}
