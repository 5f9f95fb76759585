package server

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/proxy"
)

func TestRouter_LargePromptsCountedByWorkerTokenizer(t *testing.T) {
	prompt := strings.Repeat("word ", 400) // 2000 chars: estimated at 500 tokens
	tests := []struct {
		kind      string
		tokenizer func(body map[string]any) string
	}{
		{"llamacpp", func(b map[string]any) string {
			if b["content"] != strings.TrimSpace(prompt) && b["content"] != prompt {
				return `{"tokens":[]}`
			}
			return `{"tokens":[` + strings.TrimSuffix(strings.Repeat("7,", 401), ",") + `]}`
		}},
		{"vllm", func(b map[string]any) string {
			if b["model"] != "m" || b["prompt"] != prompt {
				return `{"count":0}`
			}
			return `{"count":401,"max_model_len":8192,"tokens":[]}`
		}},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/tokenize":
					var b map[string]any
					json.NewDecoder(r.Body).Decode(&b)
					io.WriteString(w, tt.tokenizer(b))
				case "/health":
					io.WriteString(w, `{"status":"ok"}`)
				case "/v1/models":
					io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
				case "/v1/completions":
					io.WriteString(w, `{"choices":[{"text":"x"}],"usage":{"completion_tokens":1}}`)
				default:
					http.NotFound(w, r)
				}
			}))
			defer ws.Close()
			cfg := config.DefaultConfig()
			cfg.Workers = []config.Worker{{Name: "gpu0", URL: ws.URL, Kind: tt.kind, Models: []string{"m"}, MaxConcurrency: 1}}
			cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
			cfg.Proxy.TokenizeAbove = 100
			cfg.Proxy.TokenizeTimeout = 5 * time.Second
			r := startRouter(t, cfg)
			r.srv.ScrapeNow(context.Background())
			for _, c := range []struct {
				prompt string
				tokens int
				source string
			}{
				{prompt, 401, proxy.SourceTokenize},
				{"short", 1, proxy.SourceEstimate}, // under tokenize_above: estimated
			} {
				resp, err := http.Post(r.url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"`+c.prompt+`"}`))
				if err != nil {
					t.Fatal(err)
				}
				if body := readAll(t, resp); resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				rec, ok := r.srv.Decisions().Get(resp.Header.Get("X-Sluice-Decision"))
				if !ok {
					t.Fatal("no decision record")
				}
				if rec.PromptTokens != c.tokens || rec.PromptSource != c.source {
					t.Errorf("record: %d prompt tokens from %q, want %d from %q", rec.PromptTokens, rec.PromptSource, c.tokens, c.source)
				}
			}
		})
	}
}

// TestServer_TokenizeSurvivesAClosedPooledConnection: /tokenize is sent on
// the connections the probes left in the pool, which this worker closes
// as soon as a second request arrives on them (an idle keep-alive timeout
// beaten by a hair). Counting tokens changes nothing, so the request is
// marked idempotent and the transport resends it on a new connection.
func TestServer_TokenizeSurvivesAClosedPooledConnection(t *testing.T) {
	var dropped atomic.Int32
	ws := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connRequests{}).(*atomic.Int32).Add(1)
		switch r.URL.Path {
		case "/tokenize":
			if n > 1 {
				dropped.Add(1)
				c, _, _ := w.(http.Hijacker).Hijack()
				c.Close()
				return
			}
			io.WriteString(w, `{"tokens":[1,2,3]}`)
		case "/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	ws.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int32))
	}
	ws.Start()
	defer ws.Close()
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: ws.URL, Kind: "vllm", Models: []string{"m"}}}
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background()) // leaves a used connection in the pool
	n, err := r.srv.tokenize(context.Background(), "m", "three tokens here")
	if err != nil || n != 3 {
		t.Fatalf("tokenize = %d, %v; want 3", n, err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no /tokenize met a closed pooled connection; the test proves nothing")
	}
}
