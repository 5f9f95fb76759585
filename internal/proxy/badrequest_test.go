package proxy

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestServeHTTP_BadBodiesSayWhichFieldAndWhatItMustBe sends bodies that
// are valid JSON but wrong, and some that are not JSON, over real HTTP:
// each gets 400 in OpenAI's error shape, with param naming the field and
// a message that says what the field must be, in no Go words.
func TestServeHTTP_BadBodiesSayWhichFieldAndWhatItMustBe(t *testing.T) {
	srv := httptest.NewServer(New(Options{})) // the scheduler is never reached
	defer srv.Close()
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	param := func(s string) *string { return &s }
	tests := []struct {
		name, path, body string
		want             apiError
	}{
		{"stream not a bool", "/v1/chat/completions", `{"model":"m","stream":"yes","messages":[]}`,
			apiError{`"stream" must be true or false, got a string`, "invalid_request_error", param("stream"), "invalid_request"}},
		{"numeric model", "/v1/chat/completions", `{"model":7,"messages":[]}`,
			apiError{`"model" must be a string, got a number`, "invalid_request_error", param("model"), "invalid_request"}},
		{"fractional max_tokens", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":2.5}`,
			apiError{`"max_tokens" must be a whole number, got 2.5`, "invalid_request_error", param("max_tokens"), "invalid_request"}},
		{"max_tokens as text", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":"64"}`,
			apiError{`"max_tokens" must be a whole number, got a string`, "invalid_request_error", param("max_tokens"), "invalid_request"}},
		{"negative max_tokens", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":-1}`,
			apiError{`"max_tokens" must not be negative, got -1 (leave it out for no limit)`, "invalid_request_error", param("max_tokens"), "invalid_request"}},
		{"negative max_output_tokens", "/v1/responses", `{"model":"m","input":"a","max_output_tokens":-4}`,
			apiError{`"max_output_tokens" must not be negative, got -4 (leave it out for no limit)`, "invalid_request_error", param("max_output_tokens"), "invalid_request"}},
		{"n_predict under -1", "/completion", `{"prompt":"a","n_predict":-2}`,
			apiError{`"n_predict" must be -1 (no limit) or more, got -2`, "invalid_request_error", param("n_predict"), "invalid_request"}},
		{"missing model", "/v1/chat/completions", `{"messages":[]}`,
			apiError{`missing required field "model" (a string naming the model)`, "invalid_request_error", param("model"), "invalid_request"}},
		{"array body", "/v1/chat/completions", `[{"model":"m"}]`,
			apiError{"request body must be a JSON object ({...}), got an array", "invalid_request_error", nil, "invalid_request"}},
		{"string body", "/v1/chat/completions", `"hello"`,
			apiError{"request body must be a JSON object ({...}), got a string", "invalid_request_error", nil, "invalid_request"}},
		{"not JSON", "/v1/chat/completions", `{"model":`,
			apiError{"request body is not valid JSON: unexpected end of JSON input (at byte 9)", "invalid_request_error", nil, "invalid_request"}},
		{"empty", "/v1/chat/completions", ``,
			apiError{"request body is empty: want a JSON object", "invalid_request_error", nil, "invalid_request"}},
		// What a chat or completion request must hold, as OpenAI's API
		// requires it: refused here rather than in a worker's own words.
		{"chat without messages", "/v1/chat/completions", `{"model":"m"}`,
			apiError{`missing required field "messages" (an array of messages, each an object with a "role")`, "invalid_request_error", param("messages"), "invalid_request"}},
		{"chat with null messages", "/v1/chat/completions", `{"model":"m","messages":null}`,
			apiError{`missing required field "messages" (an array of messages, each an object with a "role")`, "invalid_request_error", param("messages"), "invalid_request"}},
		{"messages a string", "/v1/chat/completions", `{"model":"m","messages":"hi"}`,
			apiError{`"messages" must be an array of messages, each an object with a "role", got a string`, "invalid_request_error", param("messages"), "invalid_request"}},
		{"messages an object", "/v1/chat/completions", `{"model":"m","messages":{"role":"user","content":"hi"}}`,
			apiError{`"messages" must be an array of messages, each an object with a "role", got an object`, "invalid_request_error", param("messages"), "invalid_request"}},
		{"messages empty", "/v1/chat/completions", `{"model":"m","messages":[]}`,
			apiError{`"messages" must hold at least one message, got an empty array`, "invalid_request_error", param("messages"), "invalid_request"}},
		{"a message a string", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},"b"]}`,
			apiError{`"messages[1]" must be a message object with a "role", got a string`, "invalid_request_error", param("messages[1]"), "invalid_request"}},
		{"a message without a role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"a"}]}`,
			apiError{`missing required field "messages[0].role" (a string such as "user" or "assistant")`, "invalid_request_error", param("messages[0].role"), "invalid_request"}},
		{"a role a number", "/v1/chat/completions", `{"model":"m","messages":[{"role":1,"content":"a"}]}`,
			apiError{`"messages[0].role" must be a string such as "user" or "assistant", got a number`, "invalid_request_error", param("messages[0].role"), "invalid_request"}},
		{"a role empty", "/v1/chat/completions", `{"model":"m","messages":[{"role":"","content":"a"}]}`,
			apiError{`"messages[0].role" must be a string such as "user" or "assistant", got an empty string`, "invalid_request_error", param("messages[0].role"), "invalid_request"}},
		{"completion without prompt", "/v1/completions", `{"model":"m","max_tokens":4}`,
			apiError{`missing required field "prompt" (a string, an array of strings, or token ids)`, "invalid_request_error", param("prompt"), "invalid_request"}},
		{"prompt a number", "/v1/completions", `{"model":"m","prompt":5}`,
			apiError{`"prompt" must be a string, an array of strings, or token ids, got a number`, "invalid_request_error", param("prompt"), "invalid_request"}},
		{"native completion without prompt", "/completion", `{"n_predict":4}`,
			apiError{`missing required field "prompt" (a string, an array of strings, or token ids)`, "invalid_request_error", param("prompt"), "invalid_request"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(srv.URL+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", resp.StatusCode, raw)
			}
			if got, want := resp.Header.Get("X-Sluice-Reason"), "invalid_request"; got != want {
				t.Errorf("X-Sluice-Reason %q, want %q", got, want)
			}
			// The shape itself: exactly error.{message,type,param,code},
			// param present (null when the error is about no one field).
			var shape map[string]map[string]any
			if err := json.Unmarshal(raw, &shape); err != nil {
				t.Fatalf("body %s: %v", raw, err)
			}
			keys := slices.Sorted(maps.Keys(shape["error"]))
			if diff := cmp.Diff([]string{"code", "message", "param", "type"}, keys); len(shape) != 1 || diff != "" {
				t.Errorf("body %s: not OpenAI's error shape (-want +got keys):\n%s", raw, diff)
			}
			var got struct{ Error apiError }
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.Error); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServeHTTP_BadMessagesBodiesSayWhichFieldInAnthropicsShape sends
// Messages bodies whose messages are missing or of the wrong shape over
// real HTTP: each gets 400 in Anthropic's error shape, its message naming
// the field (with the message's index) and what it must be, in no Go
// words, on /v1/messages and /v1/messages/count_tokens alike.
func TestServeHTTP_BadMessagesBodiesSayWhichFieldInAnthropicsShape(t *testing.T) {
	srv := httptest.NewServer(New(Options{})) // the scheduler is never reached
	defer srv.Close()
	tests := []struct{ name, messages, want string }{
		{"missing", ``, `messages: Field required (an array of messages)`},
		{"null", `,"messages":null`, `messages: Field required (an array of messages)`},
		{"a string", `,"messages":"hi"`, `messages: must be an array of messages, got a string`},
		{"an object", `,"messages":{"role":"user","content":"hi"}`, `messages: must be an array of messages, got an object`},
		{"empty", `,"messages":[]`, `messages: at least one message is required`},
		{"a message a string", `,"messages":[{"role":"user","content":"a"},"b"]`, `messages.1: must be a message object with "role" and "content", got a string`},
		{"a message null", `,"messages":[null]`, `messages.0: must be a message object with "role" and "content", got null`},
		{"a role a number", `,"messages":[{"role":1,"content":"a"}]`, `messages.0.role: must be "user" or "assistant", got a number`},
		{"no role", `,"messages":[{"content":"a"}]`, `messages.0.role: Field required ("user" or "assistant")`},
	}
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		for _, tt := range tests {
			t.Run(path+" "+tt.name, func(t *testing.T) {
				resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"model":"m","max_tokens":8`+tt.messages+`}`))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				raw, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("status %d, want 400; body %s", resp.StatusCode, raw)
				}
				var got anthropicErrorBody
				if err := json.Unmarshal(raw, &got); err != nil {
					t.Fatalf("body %s: %v", raw, err)
				}
				want := anthropicErrorBody{Type: "error"}
				want.Error.Type, want.Error.Message = "invalid_request_error", tt.want
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// A malformed SLO header gets 400 naming the header and its value, before
// the request is admitted anywhere.
func TestServeHTTP_BadSLOHeaderIsNamed(t *testing.T) {
	srv := httptest.NewServer(New(Options{})) // the scheduler is never reached
	defer srv.Close()
	for _, tt := range []struct{ header, value string }{
		{"X-Sluice-TTFT-SLO", "soon"},
		{"X-Sluice-TTFT-SLO", "-5ms"},
		{"X-Sluice-Min-Decode", "fast"},
	} {
		t.Run(tt.header+"="+tt.value, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set(tt.header, tt.value)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct{ Message, Code string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_header" ||
				!strings.Contains(e.Error.Message, tt.header) || !strings.Contains(e.Error.Message, tt.value) {
				t.Fatalf("%d %+v: want 400 invalid_header naming %s and %q", resp.StatusCode, e.Error, tt.header, tt.value)
			}
		})
	}
}
