package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// vllmWorker is a loopback server answering vLLM's probes with a KV
// cache of blocks×16 tokens, of which the test sets the share in use.
type vllmWorker struct {
	srv    *httptest.Server
	blocks int
	usage  atomic.Value // string, e.g. "0.5"
}

func newVLLMWorker(t *testing.T, blocks int, usage string) *vllmWorker {
	w := &vllmWorker{blocks: blocks}
	w.usage.Store(usage)
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			rw.WriteHeader(http.StatusOK)
		case "/v1/models":
			io.WriteString(rw, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case "/metrics":
			fmt.Fprintf(rw, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n"+
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"+
				"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} %s\n"+
				"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"%d\"} 1\n",
				w.usage.Load(), w.blocks)
		case "/v1/chat/completions":
			rw.Header().Set("Content-Type", "application/json")
			io.WriteString(rw, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}`)
		default:
			http.NotFound(rw, r)
		}
	}))
	t.Cleanup(w.srv.Close)
	return w
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
				{Name: "small", URL: small.srv.URL, Kind: "vllm", Models: []string{"m"}},
				{Name: "big", URL: big.srv.URL, Kind: "vllm", Models: []string{"m"}},
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
