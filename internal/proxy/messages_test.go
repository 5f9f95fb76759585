package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// Each engine's Messages stream is relayed byte for byte, and metered from
// its events: output tokens from message_delta's usage (else the content
// deltas), the prompt from message_start's or message_delta's usage with
// the cached tokens, the first token at the first content delta, the end
// at message_stop; an error event or a stream cut short fails it and, cut
// short, is ended with an Anthropic error event of Sluice's own.
func TestMessages_StreamGolden(t *testing.T) {
	tests := []struct {
		file            string
		tokens, prompt  int
		complete, fails bool
		appended        bool // Sluice ends it with an error event
	}{
		{"llamacpp_stream.sse", 3, 42, true, false, false},
		{"vllm_stream.sse", 7, 42, true, false, false},
		{"anthropic_tool_stream.sse", 89, 472, true, false, false},
		{"anthropic_error_stream.sse", 1, 25, false, true, false},
		{"truncated_stream.sse", 1, 42, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", "messages", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			for _, size := range []int{1, 7, len(in)} { // however the reads fall
				rec := httptest.NewRecorder()
				m, err := relayStream(rec, &chunkReader{b: in, size: size}, time.Now(), protocolFor("/v1/messages"), failureText{})
				out := rec.Body.Bytes()
				if !bytes.HasPrefix(out, in) {
					t.Fatalf("read %d at a time: relayed stream differs from the worker's:\n%s", size, out)
				}
				if rest := out[len(in):]; tt.appended != (len(rest) > 0) {
					t.Fatalf("read %d at a time: appended %q, want an error event: %v", size, rest, tt.appended)
				} else if tt.appended && (!bytes.HasPrefix(rest, []byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"")) || !bytes.HasSuffix(rest, []byte("\n\n"))) {
					t.Errorf("appended %q, want an Anthropic error event", rest)
				}
				if (err != nil) != tt.fails || m.complete != tt.complete {
					t.Errorf("read %d at a time: err %v, complete %v; want failure %v, complete %v", size, err, m.complete, tt.fails, tt.complete)
				}
				if m.tokens != tt.tokens || m.promptTokens != tt.prompt {
					t.Errorf("read %d at a time: %d output and %d prompt tokens, want %d and %d", size, m.tokens, m.promptTokens, tt.tokens, tt.prompt)
				}
				if m.ttft <= 0 {
					t.Errorf("read %d at a time: no first token measured", size)
				}
			}
		})
	}
}

// The first token is the first content delta with text, thinking or tool
// input, not message_start, a block's start, a ping or an empty delta.
func TestMessages_FirstTokenIsTheFirstContentDelta(t *testing.T) {
	events := []struct {
		data    string
		content bool
	}{
		{`{"type":"message_start","message":{"usage":{"input_tokens":5}}}`, false},
		{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, false},
		{`{"type": "ping"}`, false},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`, false},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}`, false},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`, true},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"b"}}`, true},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`, true},
	}
	for _, e := range events {
		if got := readAnthropicEvent([]byte(e.data)); got.content != e.content || !got.valid {
			t.Errorf("%s: content %v (valid %v), want %v", e.data, got.content, got.valid, e.content)
		}
	}
}

// A whole Messages answer is relayed as is and its usage read: the prompt
// is input_tokens plus the cached tokens beside them.
func TestMessages_WholeGolden(t *testing.T) {
	for _, tt := range []struct {
		file           string
		tokens, prompt int
	}{
		{"llamacpp_message.json", 3, 42},
		{"vllm_message.json", 7, 42},
	} {
		in, err := os.ReadFile(filepath.Join("testdata", "messages", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		m, err := relayWhole(rec, bytes.NewReader(in), maxParse)
		if err != nil || !bytes.Equal(rec.Body.Bytes(), in) {
			t.Fatalf("%s: err %v, relayed %q", tt.file, err, rec.Body.Bytes())
		}
		if m.tokens != tt.tokens || m.promptTokens != tt.prompt {
			t.Errorf("%s: %d output and %d prompt tokens, want %d and %d", tt.file, m.tokens, m.promptTokens, tt.tokens, tt.prompt)
		}
	}
}

// A Messages body is read once for its model, limits, prompt size, prefix
// blocks and session field; what is wrong is named in Anthropic's terms.
func TestMessages_Parse(t *testing.T) {
	long := strings.Repeat("You are a careful coding agent. ", 40)
	tests := []struct {
		name, body string
		count      bool
		param      string // "" when it parses
		check      func(t *testing.T, p parsed)
	}{
		{"system string and tool blocks", `{"model":"m","max_tokens":64,"stream":true,"system":"` + long + `",
			"metadata":{"user_id":"user_ab_account_cd_session_5e2f"},
			"messages":[{"role":"user","content":"list files"},
			{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"ls","input":{"path":"."}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a.go b.go"}],"cache_control":{"type":"ephemeral"}},
			{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]}]}`, false, "",
			func(t *testing.T, p parsed) {
				if p.model != "m" || p.maxTokens != 64 || !p.stream || p.metadataUserID != "user_ab_account_cd_session_5e2f" {
					t.Errorf("parsed %+v", p)
				}
				if len(p.prefix) < 2 {
					t.Errorf("%d prefix blocks from a %d-byte system prompt, want 2 or more", len(p.prefix), len(long))
				}
				if p.promptTokens < len(long)/4+mediaTokens {
					t.Errorf("prompt of %d tokens, want at least the system prompt's %d and an image's %d", p.promptTokens, len(long)/4, mediaTokens)
				}
			}},
		{"system as text blocks", `{"model":"m","max_tokens":1,"system":[{"type":"text","text":"` + long + `","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`, false, "",
			func(t *testing.T, p parsed) {
				// The same system prompt as a string gives the same blocks:
				// a cache_control breakpoint is not text.
				q, _ := parseMessages([]byte(`{"model":"m","max_tokens":1,"system":"`+long+`","messages":[{"role":"user","content":"hi"}]}`), false)
				if len(p.prefix) == 0 || !equalHashes(p.prefix, q.prefix) {
					t.Errorf("system as blocks: %d blocks, as a string: %d; want the same", len(p.prefix), len(q.prefix))
				}
			}},
		{"count_tokens needs no max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, true, "", nil},
		{"missing model", `{"max_tokens":1,"messages":[]}`, false, "model", nil},
		{"missing messages", `{"model":"m","max_tokens":1}`, false, "messages", nil},
		{"missing max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false, "max_tokens", nil},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, false, "max_tokens", nil},
		{"content a number", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":5}]}`, false, "messages", nil},
		{"block without a type", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"text":"a"}]}]}`, false, "messages", nil},
		{"system an object", `{"model":"m","max_tokens":1,"system":{"a":1},"messages":[]}`, false, "system", nil},
		{"model a number", `{"model":5,"max_tokens":1,"messages":[]}`, false, "model", nil},
		{"not JSON", `{"model":`, false, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseMessages([]byte(tt.body), tt.count)
			var bad *badRequest
			switch {
			case tt.param == "" && tt.name == "not JSON":
				if !errors.As(err, &bad) {
					t.Fatalf("err %v, want a badRequest", err)
				}
			case tt.param == "":
				if err != nil {
					t.Fatalf("err %v", err)
				}
				if tt.check != nil {
					tt.check(t, p)
				}
			case !errors.As(err, &bad) || bad.param != tt.param || !strings.Contains(bad.msg, tt.param):
				t.Fatalf("err %v, want one about %q naming it", err, tt.param)
			}
		})
	}
}

func equalHashes(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A conversation's next turn renders to text the previous turn's
// rendering is a prefix of, even when the client moves its cache_control
// breakpoint to the newest message, as Claude Code does.
func TestMessages_NextTurnExtendsThePrefix(t *testing.T) {
	sys := strings.Repeat("system prompt text ", 60)
	turn1 := `{"model":"m","max_tokens":8,"system":"` + sys + `","messages":[
		{"role":"user","content":[{"type":"text","text":"read main.go","cache_control":{"type":"ephemeral"}}]}]}`
	turn2 := `{"model":"m","max_tokens":8,"system":"` + sys + `","messages":[
		{"role":"user","content":[{"type":"text","text":"read main.go"}]},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{"file":"main.go"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package main","cache_control":{"type":"ephemeral"}}]}]}`
	p1, err1 := parseMessages([]byte(turn1), false)
	p2, err2 := parseMessages([]byte(turn2), false)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	ix := prefix.NewIndex(prefix.Options{})
	ix.Record("m", p1.prefix, "w")
	got := []float64{0}
	if ix.MatchSources("m", p2.prefix, []string{"w"}, got, []bool{false}); got[0] == 0 {
		t.Errorf("turn 2 matches none of turn 1's blocks (%d and %d blocks)", len(p1.prefix), len(p2.prefix))
	}
}

// Every refusal on the Messages routes is in Anthropic's error shape with
// Anthropic's status: capacity refusals are 529 overloaded_error with
// Retry-After, a key's own rate 429 rate_limit_error.
func TestMessages_ErrorShape(t *testing.T) {
	tests := []struct {
		status     int
		reason     string
		wantStatus int
		wantType   string
	}{
		{400, "invalid_request", 400, "invalid_request_error"},
		{400, "context_length_exceeded", 400, "invalid_request_error"},
		{401, "invalid_api_key", 401, "authentication_error"},
		{403, "admin_loopback_only", 403, "permission_error"},
		{404, "model_not_found", 404, "not_found_error"},
		{413, "body_too_large", 413, "request_too_large"},
		{429, "rate_limited", 429, "rate_limit_error"},
		{429, "queue_full", statusOverloaded, "overloaded_error"},
		{503, "slo_unmeetable", statusOverloaded, "overloaded_error"},
		{503, "deadline_unmeetable", statusOverloaded, "overloaded_error"},
		{502, "upstream_failed", 502, "api_error"},
		{500, "internal", 500, "api_error"},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		writeAnthropicError(rec, tt.status, tt.reason, "", "why")
		var body anthropicErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tt.wantStatus || body.Type != "error" || body.Error.Type != tt.wantType || body.Error.Message != "why" || rec.Header().Get("X-Sluice-Reason") != tt.reason {
			t.Errorf("%d %s: answered %d %s", tt.status, tt.reason, rec.Code, rec.Body.Bytes())
		}
	}
	// A refusal of the scheduler keeps its Retry-After.
	rec := httptest.NewRecorder()
	writeRefusal(protocolFor("/v1/messages"), rec, &scheduler.Refusal{Err: scheduler.ErrQueueFull, Reason: "queue_full", RetryAfter: 3 * time.Second}, "m")
	if rec.Code != statusOverloaded || rec.Header().Get("Retry-After") != "3" || !strings.Contains(rec.Body.String(), `"overloaded_error"`) {
		t.Errorf("queue full on /v1/messages: %d, Retry-After %q, %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	if rec := httptest.NewRecorder(); true {
		WriteErrorFor(rec, "/v1/chat/completions", http.StatusNotFound, "not_found", "no route")
		if !strings.Contains(rec.Body.String(), `"code":"not_found"`) {
			t.Errorf("an OpenAI route's error is not OpenAI's shape: %s", rec.Body.String())
		}
	}
}
