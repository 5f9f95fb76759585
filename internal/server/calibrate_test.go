package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/proxy"
)

// golden reads a worker payload from the telemetry package's golden files.
func golden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "telemetry", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tokenHungryLlama is a llama-server on loopback, with the current build's
// probes (4 slots of 2048 tokens, from the golden payloads), whose
// tokenizer counts a token every two characters of message text plus 28
// for its chat template: twice what four characters a token says, as the
// issue's real worker did (400 words, estimated 404, counted 828). It
// refuses a prompt that does not fit its slot as llama-server does.
func tokenHungryLlama(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var chats atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/metrics":
			io.WriteString(w, golden(t, "llamacpp_metrics_current.txt"))
		case "/slots":
			io.WriteString(w, golden(t, "llamacpp_slots_current.json"))
		case "/props":
			io.WriteString(w, golden(t, "llamacpp_props_current.json"))
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case "/v1/chat/completions":
			chats.Add(1)
			var body struct {
				Messages []struct {
					Content string `json:"content"`
				} `json:"messages"`
			}
			json.NewDecoder(r.Body).Decode(&body)
			n := 28
			for _, m := range body.Messages {
				n += utf8.RuneCountInString(m.Content) / 2
			}
			w.Header().Set("Content-Type", "application/json")
			if n >= 2048 {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"error":{"code":400,"message":"request (%d tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":%d,"n_ctx":2048}}`, n, n)
				return
			}
			fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"completion_tokens":1,"prompt_tokens":%d,"total_tokens":%d}}`, n, n+1)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &chats
}

func chatText(text string) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":%q}]}`, text)
}

// TestRouter_PromptEstimateLearnsTheWorkersTokenizer: after one answer
// whose usage says the model's tokenizer counts twice what text/4 guesses,
// the next prompt is estimated from that ratio, and a prompt too long for
// every slot is refused by Sluice's context check (400
// context_length_exceeded) instead of being sent to a worker that refuses
// it. The decision records say where each estimate came from.
func TestRouter_PromptEstimateLearnsTheWorkersTokenizer(t *testing.T) {
	srv, chats := tokenHungryLlama(t)
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	cfg.Workers = []config.Worker{{Name: "a", URL: srv.URL, Kind: "llamacpp", Models: []string{"m"}}}
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background())

	// 400 words: text/4 says 404, the worker counts 828.
	resp := post(t, context.Background(), r.url, chatText(strings.Repeat("abc ", 400)))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("400 words: %d %s", resp.StatusCode, body)
	}
	if rec := record(t, r, resp); rec.PromptTokens != 404 || rec.PromptSource != proxy.SourceEstimate {
		t.Fatalf("first estimate %d from %q, want 404 from %q", rec.PromptTokens, rec.PromptSource, proxy.SourceEstimate)
	}

	// 6,000 characters: text/4 says about 1,500, under the 2,048 of a slot;
	// the worker would count 3,028.
	resp = post(t, context.Background(), r.url, chatText(strings.Repeat("abcdef ", 857)+"a"))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Sluice-Reason") != "context_length_exceeded" {
		t.Fatalf("6,000 characters: %d (reason %q) %s; want 400 context_length_exceeded from Sluice", resp.StatusCode, resp.Header.Get("X-Sluice-Reason"), body)
	}
	if n := chats.Load(); n != 1 {
		t.Fatalf("the worker got %d chat requests, want 1: the long prompt must not reach it", n)
	}

	// A prompt that fits is estimated with the learned ratio too.
	resp = post(t, context.Background(), r.url, chatText(strings.Repeat("abc ", 300)))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("300 words: %d %s", resp.StatusCode, body)
	}
	rec := record(t, r, resp)
	if !strings.HasPrefix(rec.PromptSource, proxy.SourceCalibrated) || rec.PromptTokens < 600 || rec.PromptTokens > 650 {
		t.Fatalf("300 words estimated at %d from %q; want about 2 × 300 (the worker counts 628) from %q", rec.PromptTokens, rec.PromptSource, proxy.SourceCalibrated)
	}
}
