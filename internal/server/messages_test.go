package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// postMessages sends a Messages request as Anthropic's SDKs do: the key
// in x-api-key, anthropic-version, a JSON body.
func postMessages(t *testing.T, url, path, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Accept", "application/json")
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// anthropicError reads an Anthropic error body.
func anthropicError(t *testing.T, resp *http.Response) (typ, msg string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Type != "error" {
		t.Fatalf("%d: not an Anthropic error body (%v)", resp.StatusCode, err)
	}
	resp.Body.Close()
	return e.Error.Type, e.Error.Message
}

// TestMessages_EndToEndThroughTheSim sends Messages requests shaped like
// the Anthropic SDK's through the router to simulated llama-servers: an
// x-api-key is the client's key, the stream comes back event by event and
// whole, count_tokens is answered, a worker kind without the route never
// gets it, and every refusal is in Anthropic's shape.
func TestMessages_EndToEndThroughTheSim(t *testing.T) {
	specs := sim.DemoFleet()[:2]
	fl := startFastSims(t, specs)
	model := specs[0].Params.Model
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = 20 * time.Millisecond
	cfg.Stats.Store = "memory"
	cfg.Auth.Keys = []config.APIKey{{KeySHA256: sha("sk-ant-test"), Tenant: "acme"}}
	for i, w := range fl.Workers() {
		<-w.Server.Ready()
		kind := "llamacpp"
		if i == 1 {
			kind = "openai" // serves chat, not assumed to serve /v1/messages
		}
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: kind})
	}
	r := startRouter(t, cfg)
	llama := fl.Workers()[0].Name

	body := `{"model":"` + model + `","max_tokens":12,"system":"You are terse.","metadata":{"user_id":"user_x_account_y_session_42"},"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]`
	for _, stream := range []bool{true, false} {
		b := body + `,"stream":false}`
		if stream {
			b = body + `,"stream":true}`
		}
		resp := postMessages(t, r.url, "/v1/messages", "sk-ant-test", b)
		if resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Worker") != llama {
			t.Fatalf("stream %v: %d on %s, want 200 on %s", stream, resp.StatusCode, resp.Header.Get("X-Sluice-Worker"), llama)
		}
		text := readAll(t, resp)
		if stream {
			var events []string
			sc := bufio.NewScanner(strings.NewReader(text))
			for sc.Scan() {
				if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
					events = append(events, ev)
				}
			}
			if len(events) < 4 || events[0] != "message_start" || events[len(events)-1] != "message_stop" || strings.Contains(text, "[DONE]") {
				t.Fatalf("stream's events %v", events)
			}
		} else {
			var msg struct {
				Type    string
				Content []struct{ Type, Text string }
				Usage   struct {
					InputTokens  int `json:"input_tokens"`
					OutputTokens int `json:"output_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(text), &msg); err != nil || msg.Type != "message" || msg.Usage.OutputTokens == 0 || len(msg.Content) != 1 {
				t.Fatalf("answer %s (%v)", text, err)
			}
		}
		rec, ok := r.srv.Decisions().Get(resp.Header.Get("X-Sluice-Decision"))
		if !ok {
			t.Fatal("no decision record")
		}
		if ex := rec.Explain(); !strings.HasPrefix(ex.Session, "metadata.user_id #") || strings.Contains(ex.Session, "42") && len(ex.Session) < 20 {
			t.Errorf("record's session %q, want its source and a digest", ex.Session)
		}
	}

	resp := postMessages(t, r.url, "/v1/messages/count_tokens", "sk-ant-test", `{"model":"`+model+`","messages":[{"role":"user","content":"hello there"}]}`)
	if text := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(text, `"input_tokens"`) {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, text)
	}

	for _, tt := range []struct {
		name, key, body string
		status          int
		typ             string
	}{
		{"no key", "", body + `}`, 401, "authentication_error"},
		{"bad key", "sk-wrong", body + `}`, 401, "authentication_error"},
		{"bad JSON", "sk-ant-test", `{"model":`, 400, "invalid_request_error"},
		{"no max_tokens", "sk-ant-test", `{"model":"` + model + `","messages":[]}`, 400, "invalid_request_error"},
		{"unknown model", "sk-ant-test", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
	} {
		resp := postMessages(t, r.url, "/v1/messages", tt.key, tt.body)
		if typ, msg := anthropicError(t, resp); resp.StatusCode != tt.status || typ != tt.typ || msg == "" {
			t.Errorf("%s: %d %s %q, want %d %s", tt.name, resp.StatusCode, typ, msg, tt.status, tt.typ)
		}
	}
}

// The client's key, in either header, never reaches a worker, and
// anthropic-version does; a model served only by a worker kind without
// the route is refused with 404 route_not_served, not sent there.
func TestMessages_HeadersToTheWorker(t *testing.T) {
	var mu sync.Mutex
	var seen http.Header
	w := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
			return
		}
		if r.URL.Path != "/v1/messages" {
			http.NotFound(w, r) // telemetry probes: not the request under test
			return
		}
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"type":"message","content":[],"usage":{"input_tokens":3,"output_tokens":1}}`))
	}))
	defer w.Close()
	cfg := testConfig(t, nil, func(c *config.Config) {
		c.Workers = []config.Worker{{Name: "llama", URL: w.URL, Kind: "llamacpp", Models: []string{"m"}},
			{Name: "tgi", URL: w.URL, Kind: "tgi", Models: []string{"other"}}}
		c.Auth.Keys = []config.APIKey{{KeySHA256: sha("sk-ant-test"), Tenant: "acme"}}
	})
	r := startRouter(t, cfg)
	resp := postMessages(t, r.url, "/v1/messages", "sk-ant-test", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if text := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, text)
	}
	mu.Lock()
	if seen.Get("X-Api-Key") != "" || seen.Get("Authorization") != "" || seen.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("worker saw x-api-key %q, authorization %q, anthropic-version %q", seen.Get("X-Api-Key"), seen.Get("Authorization"), seen.Get("Anthropic-Version"))
	}
	mu.Unlock()
	resp = postMessages(t, r.url, "/v1/messages", "sk-ant-test", `{"model":"other","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if typ, _ := anthropicError(t, resp); resp.StatusCode != 404 || typ != "not_found_error" || resp.Header.Get("X-Sluice-Reason") != "route_not_served" {
		t.Errorf("model served by tgi only: %d %s %s", resp.StatusCode, typ, resp.Header.Get("X-Sluice-Reason"))
	}
}
