package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/prefix/prefixtest"
)

// decodeTwice is how a request body was read before the proxy decoded it
// once: json.Valid over the whole body, then json.Unmarshal with messages
// kept raw, and later prefix.FromBody decoding the whole body again. The
// tests below hold the one decode to what these said.
func decodeTwice(body []byte) (messages, prompt json.RawMessage, blocks []uint64, err error) {
	var in struct {
		Model               *string         `json:"model"`
		Stream              bool            `json:"stream"`
		MaxTokens           *int            `json:"max_tokens"`
		MaxCompletionTokens *int            `json:"max_completion_tokens"`
		NPredict            *int            `json:"n_predict"`
		MaxOutputTokens     *int            `json:"max_output_tokens"`
		Messages            json.RawMessage `json:"messages"`
		Prompt              json.RawMessage `json:"prompt"`
		Input               json.RawMessage `json:"input"`
		Instructions        json.RawMessage `json:"instructions"`
		Query               json.RawMessage `json:"query"`
		Documents           json.RawMessage `json:"documents"`
	}
	if firstByte(body) == 0 {
		return nil, nil, nil, &badRequest{"", "request body is empty: want a JSON object"}
	}
	if !json.Valid(body) {
		var syn *json.SyntaxError
		if err := json.Unmarshal(body, new(json.RawMessage)); errors.As(err, &syn) {
			return nil, nil, nil, &badRequest{"", fmt.Sprintf("request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)}
		}
		return nil, nil, nil, &badRequest{"", "request body is not valid JSON"}
	}
	if t := firstByte(body); t != '{' {
		return nil, nil, nil, &badRequest{"", fmt.Sprintf("request body must be a JSON object ({...}), got %s", jsonKind(t))}
	}
	err = json.Unmarshal(body, &in)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return nil, nil, nil, &badRequest{te.Field, fmt.Sprintf("%q must be %s, got %s", te.Field, wantJSON(te.Type), gotJSON(te.Value))}
	}
	if err != nil {
		return nil, nil, nil, &badRequest{"", "request body could not be read as JSON: " + err.Error()}
	}
	return in.Messages, in.Prompt, prefixtest.FromBody(body, prefix.BlockBytes), nil
}

// sameAsTwice fails t unless parsing body in one decode refuses it as the
// two decodes did, or reads the same messages, prompt and prefix blocks.
func sameAsTwice(t *testing.T, body []byte) {
	t.Helper()
	wantMsgs, wantPrompt, wantBlocks, wantErr := decodeTwice(body)
	var in inference
	err := decodeBody(body, &in)
	if (err == nil) != (wantErr == nil) || (err != nil && err.(*badRequest).msg != wantErr.(*badRequest).msg) ||
		(err != nil && err.(*badRequest).param != wantErr.(*badRequest).param) {
		t.Fatalf("body %.200q: refusal %v, want %v", body, err, wantErr)
	}
	if err != nil {
		return
	}
	if !bytes.Equal(in.Messages.raw, wantMsgs) || !bytes.Equal(in.Prompt, wantPrompt) {
		t.Fatalf("body %.200q: messages %q prompt %q, want %q and %q", body, in.Messages.raw, in.Prompt, wantMsgs, wantPrompt)
	}
	p, err := parseInference(body, false, nil)
	if err != nil {
		return // a limit refused after the decode, the same code as before
	}
	if !slices.Equal(p.prefix, wantBlocks) {
		t.Fatalf("body %.200q: prefix blocks %v, want prefix.FromBody's %v", body, p.prefix, wantBlocks)
	}
}

// oneDecodeBodies are bodies where one decode could read otherwise than
// the two it replaces: repeated keys, messages of the wrong shape, nulls.
var oneDecodeBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("long enough for blocks ", 60) + `"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("part ", 300) + `"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
	`{"model":"m","prompt":"` + strings.Repeat("a raw prompt ", 100) + `"}`,
	`{"model":"m","prompt":[` + strings.Repeat("1,", 400) + `2]}`,
	`{"model":"m","messages":null,"prompt":null}`,
	`{"model":"m","messages":"` + strings.Repeat("not a list ", 100) + `","prompt":"` + strings.Repeat("x", 1200) + `"}`,
	`{"model":"m","messages":[{"role":1}],"prompt":"` + strings.Repeat("x", 1200) + `"}`,
	`{"model":"m","messages":[1,2],"prompt":"` + strings.Repeat("x", 1200) + `"}`,
	// Repeated keys: FromBody decoded each into the same slice (the
	// second's messages merge into the first's), and refused the body if
	// any of them was not a list of messages.
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("first ", 200) + `"}],"messages":[{"role":"system"}]}`,
	`{"model":"m","messages":"bad","messages":[{"role":"user","content":"` + strings.Repeat("second ", 200) + `"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("first ", 200) + `"}],"Messages":null}`,
	`{"model":"m","prompt":"` + strings.Repeat("a", 600) + `","PROMPT":"` + strings.Repeat("b", 600) + `"}`,
	// Refusals: the same words as before.
	``, `  `, `[1]`, `"s"`, `7`, `null`, `{"model":`, `{"model":"m",}`, `{"model":"m"} x`, `[1,`, `{"model":7}`,
	`{"model":"m","stream":"yes"}`, `{"model":"m","max_tokens":2.5}`, "{\"model\":\"m\xff\"}",
}

func TestParseInference_OneDecodeReadsAsTwoDid(t *testing.T) {
	for _, body := range oneDecodeBodies {
		sameAsTwice(t, []byte(body))
	}
	// The prefix must really come out of the one decode.
	p, err := parseInference([]byte(oneDecodeBodies[0]), true, nil)
	if err != nil || len(p.prefix) == 0 {
		t.Fatalf("chat body: prefix %v, err %v; want blocks", p.prefix, err)
	}
}

// FuzzParseInference_OneDecode holds the one decode of a body to the
// decodes it replaced, on any body.
func FuzzParseInference_OneDecode(f *testing.F) {
	for _, body := range oneDecodeBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsTwice(t, body)
	})
}

// BenchmarkParseInference reads a 16-turn chat request of about 20 KB as
// the request path does: in one decode (parseInference, prefix blocks
// included), and as before it (decodeTwice, then the prompt count of the
// raw fields).
func BenchmarkParseInference(b *testing.B) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", strings.Repeat("You are a careful assistant. ", 20)}}
	for i := range 15 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, strings.Repeat(fmt.Sprintf("turn %d says something of substance. ", i), 35)})
	}
	body, err := json.Marshal(map[string]any{"model": "m", "stream": true, "max_tokens": 256, "messages": msgs})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("one decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if p, err := parseInference(body, true, nil); err != nil || len(p.prefix) == 0 {
				b.Fatal(err)
			}
		}
	})
	b.Run("as before", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			m, prompt, blocks, err := decodeTwice(body)
			if err != nil || len(blocks) == 0 {
				b.Fatal(err)
			}
			var pc promptCount
			pc.add(m)
			pc.add(prompt)
		}
	})
}

// A chat request's fields that change what its chat template renders go
// to the worker's /tokenize with its messages, in one order, null ones
// left out: without them the token ids would be another prompt's.
func TestParseInference_KeepsTheChatTemplatesInputs(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       []Field
	}{
		{"none", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"tools and kwargs, in templateFields' order",
			`{"model":"m","chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			[]Field{{"tools", json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)}, {"chat_template_kwargs", json.RawMessage(`{"enable_thinking":false}`)}}},
		{"null is absent", `{"model":"m","tools":null,"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"}]}`,
			[]Field{{"add_generation_prompt", json.RawMessage(`false`)}}},
		{"no messages: a prompt has no template", `{"model":"m","prompt":"hi","tools":[]}`, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseInference([]byte(tt.body), true, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, p.template); diff != "" {
				t.Errorf("template fields (-want +got):\n%s", diff)
			}
		})
	}
}
