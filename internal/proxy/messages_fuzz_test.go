package proxy

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParseMessages checks the Messages body parser on any bytes: it
// never panics; what it accepts has a model, a positive max_tokens and
// prompt size, and prefix blocks that are its rendered text's; what it
// refuses it refuses with a *badRequest that says what is wrong without
// speaking Go.
func FuzzParseMessages(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":8,"system":"s","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"n","input":{"a":[1,2]}}]}],"metadata":{"user_id":"{\"session_id\":\"s\"}"}}`))
	f.Add([]byte(`{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":7}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"content":[{"text":"a"}]}],"tools":[{"name":"t","input_schema":{}}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":"hi"}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a"},null,{"role":7}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a"}],"messages":{"role":"user"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, count := range []bool{false, true} {
			p, err := parseMessages(b, count)
			if err == nil {
				if p.model == "" || p.promptTokens < 1 || (!count && p.maxTokens < 1) {
					t.Fatalf("accepted %q as %+v", b, p)
				}
				continue
			}
			var bad *badRequest
			if !errors.As(err, &bad) || bad.msg == "" {
				t.Fatalf("refused %q with %T %v, want a *badRequest with a message", b, err, err)
			}
			for _, goSpeak := range []string{"Go struct", "Go value", "messagesRequest", "of type", "unmarshal"} {
				if strings.Contains(bad.msg, goSpeak) {
					t.Fatalf("refused %q with %q: speaks Go", b, bad.msg)
				}
			}
		}
	})
}

// FuzzMessagesStream relays any bytes as a Messages stream: every byte
// passes unchanged and in order (only an error event of Sluice's may
// follow), nothing negative is counted, and a stream the meter calls
// complete ended with message_stop and held no error.
func FuzzMessagesStream(f *testing.F) {
	for _, name := range []string{"llamacpp_stream.sse", "vllm_stream.sse", "anthropic_tool_stream.sse", "anthropic_error_stream.sse"} {
		if b, err := os.ReadFile(filepath.Join("testdata", "messages", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	f.Add([]byte("data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-3,\"input_tokens\":-1}}\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rec := httptest.NewRecorder()
		m, err := relayStream(rec, bytes.NewReader(in), time.Now(), protocolFor("/v1/messages"), failureText{})
		out := rec.Body.Bytes()
		if !bytes.HasPrefix(out, in) {
			t.Fatalf("relay changed the stream:\nin  %q\nout %q", in, out)
		}
		if m.tokens < 0 || m.promptTokens < 0 || m.ttft < 0 {
			t.Fatalf("measured %+v", m)
		}
		if m.complete && (err != nil || !bytes.Contains(in, []byte("message_stop"))) {
			t.Fatalf("%q: complete with err %v", in, err)
		}
	})
}
