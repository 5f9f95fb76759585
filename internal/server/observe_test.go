package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/stats"
)

// TestRouter_WholeAnswersTeachTheAveragesAsStreamsDo runs the same
// requests through two routers, each in front of an identical simulated
// llama-server in real time: one router's clients stream, the other's do
// not. Both must learn time to first token and decode rate, and agree on
// them: a fleet serving only non-streamed answers must not keep neutral
// averages forever.
func TestRouter_WholeAnswersTeachTheAveragesAsStreamsDo(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time run")
	}
	specs := sim.DemoFleet()[:2]
	for i := range specs {
		specs[i].Params = specs[0].Params
		specs[i].Params.StartupDelay = 0
		specs[i].Params.InterferenceScale = 0
	}
	fl, err := sim.StartFleet(context.Background(), specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	model := specs[0].Params.Model
	var routers []*router
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		cfg := config.DefaultConfig()
		cfg.Telemetry.Interval = time.Hour
		cfg.Telemetry.StaleAfter = time.Hour
		cfg.Workers = []config.Worker{{Name: "w", URL: w.URL, Kind: "llamacpp", Models: []string{model}}}
		routers = append(routers, startRouter(t, cfg))
	}
	const n = 5
	var wg sync.WaitGroup
	for i, r := range routers {
		stream := i == 0
		wg.Go(func() {
			for j := range n {
				body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":30,"ignore_eos":true,"sim_prompt_tokens":1000,"messages":[{"role":"user","content":"q%d"}]}`, model, stream, j)
				resp := post(t, context.Background(), r.url, body)
				if text := readAll(t, resp); resp.StatusCode != 200 {
					t.Errorf("stream=%v request %d: %d %s", stream, j, resp.StatusCode, text)
				}
			}
		})
	}
	wg.Wait()
	streamed, whole := routers[0].srv.tracker.Get("w"), routers[1].srv.tracker.Get("w")
	for _, c := range []struct {
		name string
		s, w stats.EMA
		tol  float64
	}{
		{"ttft_ms", streamed.TTFTMs, whole.TTFTMs, 0.25},
		{"decode_tps", streamed.DecodeTPS, whole.DecodeTPS, 0.25},
		{"e2e_ms", streamed.E2EMs, whole.E2EMs, 0.25},
		{"output_tokens", streamed.OutputTokens, whole.OutputTokens, 0},
	} {
		t.Logf("%-13s streamed %8.1f (n=%d) whole %8.1f (n=%d)", c.name, c.s.Value, c.s.N, c.w.Value, c.w.N)
		if c.s.N != n || c.w.N != n {
			t.Errorf("%s: %d streamed and %d whole samples, want %d each", c.name, c.s.N, c.w.N, n)
			continue
		}
		if d := math.Abs(c.w.Value-c.s.Value) / c.s.Value; d > c.tol {
			t.Errorf("%s: streamed %.1f, whole %.1f: %.0f%% apart, more than %.0f%%", c.name, c.s.Value, c.w.Value, 100*d, 100*c.tol)
		}
	}
}
