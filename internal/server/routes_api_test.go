package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// echoWorker answers every POST with a small JSON body and remembers the
// path and body it got.
type echoWorker struct {
	srv *httptest.Server

	mu    sync.Mutex
	paths []string
	body  string
}

func newEchoWorker(t *testing.T) *echoWorker {
	e := &echoWorker{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.paths = append(e.paths, r.URL.Path)
		e.body = string(b)
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"response","status":"completed","usage":{"input_tokens":5,"output_tokens":2}}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func TestRouter_ResponsesAndRerankAreProxied(t *testing.T) {
	ew := newEchoWorker(t)
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "w", URL: ew.srv.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1}}
	cfg.Stats.Store = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, cfg)

	long := strings.Repeat("panda ", 200)
	tests := []struct {
		name, path, body string
		wantMaxTokens    int
		minPrompt        int
	}{
		{"responses", "/v1/responses", `{"model":"m","input":"` + long + `","instructions":"be brief","max_output_tokens":40}`, 40, 250},
		{"responses with items", "/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"` + long + `"}]}],"stream":false}`, 0, 250},
		{"rerank", "/v1/rerank", `{"model":"m","query":"What is panda?","top_n":3,"documents":["hi","it is a bear","` + long + `"]}`, 0, 250},
		// llama.cpp's alias takes no model when the fleet serves one.
		{"llama.cpp rerank alias", "/rerank", `{"query":"What is panda?","documents":["hi","` + long + `"]}`, 0, 250},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(r.url+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			ew.mu.Lock()
			gotPath, gotBody := ew.paths[len(ew.paths)-1], ew.body
			ew.mu.Unlock()
			if gotPath != tt.path || gotBody != tt.body {
				t.Errorf("worker got %s %q, want %s with the body untouched", gotPath, gotBody, tt.path)
			}
			id := resp.Header.Get("X-Sluice-Decision")
			rec := fetchDecision(t, r.url, id)
			if rec.MaxTokens != tt.wantMaxTokens || rec.PromptTokens < tt.minPrompt || rec.Chosen != "w" {
				t.Errorf("decision %s: max_tokens %d prompt %d chosen %q; want %d, >= %d, w",
					id, rec.MaxTokens, rec.PromptTokens, rec.Chosen, tt.wantMaxTokens, tt.minPrompt)
			}
		})
	}
}

func TestRouter_ResponsesAndRerankBadBodies(t *testing.T) {
	ew := newEchoWorker(t)
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "w", URL: ew.srv.URL, Kind: "openai", Models: []string{"m"}}}
	cfg.Stats.Store = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, cfg)
	for _, tt := range []struct{ path, body, want string }{
		{"/v1/responses", `{"input":"hi"}`, `missing required field \"model\"`},
		{"/v1/rerank", `{"model":"m","query":`, "not valid JSON"},
		{"/v1/responses", `{"model":"m","input":"x","max_output_tokens":-5}`, "must not be negative"},
	} {
		resp, err := http.Post(r.url+tt.path, "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(body, tt.want) {
			t.Errorf("%s %s: status %d body %s; want 400 naming %q", tt.path, tt.body, resp.StatusCode, body, tt.want)
		}
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if n := len(ew.paths); n != 0 {
		t.Errorf("worker saw %d bad requests", n)
	}
}

// decisionView is the part of a decision record these tests read.
type decisionView struct {
	PromptTokens int    `json:"prompt_tokens"`
	MaxTokens    int    `json:"max_tokens"`
	Chosen       string `json:"chosen"`
}

func fetchDecision(t *testing.T, base, id string) decisionView {
	t.Helper()
	resp, err := http.Get(base + "/debug/decisions/" + id)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	var rec decisionView
	if err := json.Unmarshal([]byte(body), &rec); err != nil {
		t.Fatalf("decision %s: %v: %s", id, err, body)
	}
	return rec
}
