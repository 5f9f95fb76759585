package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// newVLLMWorker starts a loopback server answering vLLM's probes with a
// KV cache of blocks×16 tokens, usage of it in use.
func newVLLMWorker(t *testing.T, blocks int, usage string) *httptest.Server {
	return newTelemetryWorker(t, "", func() string {
		return fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} %s\n"+
			"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"%d\"} 1\n",
			usage, blocks)
	})
}

// TestRouter_KVFitIsTheDefault sends a prompt of about 2,500 tokens to two
// vLLM workers: "small" has the lower KV pressure (half of 4,096 tokens in
// use) but only ~2,048 tokens free, "big" the higher pressure (80% of
// 1,048,576) and room to spare. With the default configuration the KV-fit
// rule passes over small, and its record says why; with admission.kv_fit
// off the KV-pressure term picks small, where the request would wait
// inside the worker for room.
func TestRouter_KVFitIsTheDefault(t *testing.T) {
	small, big := newVLLMWorker(t, 256, "0.5"), newVLLMWorker(t, 65536, "0.8")
	prompt := strings.Repeat("abcd", 2500) // 10,000 characters: ~2,500 tokens
	body := fmt.Sprintf(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":%q}]}`, prompt)
	for _, tc := range []struct {
		name    string
		kvFit   *bool
		want    string
		whySkip string // what small's record entry says, when passed over
	}{
		{"default", nil, "big", "does not fit its free KV cache"},
		{"kv_fit off", new(bool), "small", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.DefaultConfig()
			if tc.kvFit != nil {
				cfg.Admission.KVFit = *tc.kvFit
			}
			cfg.Telemetry.Interval = 1 << 40 // probe rounds only when the test asks
			cfg.Telemetry.StaleAfter = 1 << 41
			cfg.Workers = []config.Worker{
				{Name: "small", URL: small.URL, Kind: "vllm", Models: []string{"m"}},
				{Name: "big", URL: big.URL, Kind: "vllm", Models: []string{"m"}},
			}
			r := startRouter(t, cfg)
			r.srv.ScrapeNow(context.Background())
			resp := post(t, context.Background(), r.url, body)
			readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := resp.Header.Get("X-Sluice-Worker"); got != tc.want {
				t.Fatalf("served by %s, want %s", got, tc.want)
			}
			rec := record(t, r, resp)
			var why string
			for _, c := range rec.Candidates {
				if c.Worker == "small" {
					why = c.Why
				}
			}
			if tc.whySkip == "" && why != "" || !strings.Contains(why, tc.whySkip) {
				t.Fatalf("small's record entry says %q, want %q", why, tc.whySkip)
			}
		})
	}
}
