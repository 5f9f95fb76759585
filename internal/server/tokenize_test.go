package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
