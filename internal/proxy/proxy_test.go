package proxy

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/sse"
	"github.com/sluice-router/sluice/internal/stats"
)

func TestParseInference(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		needModel bool
		want      parsed
		err       string
	}{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hello world, how are you"}],"max_tokens":64,"stream":true}`, true, parsed{model: "m", stream: true, maxTokens: 64}, ""},
		{"max_completion_tokens", `{"model":"m","prompt":"x","max_completion_tokens":9}`, true, parsed{model: "m", maxTokens: 9}, ""},
		{"native n_predict", `{"prompt":"x","n_predict":12}`, false, parsed{maxTokens: 12}, ""},
		{"missing model", `{"messages":[]}`, true, parsed{}, `missing required field "model"`},
		{"malformed", `{"model":`, true, parsed{}, "not valid JSON"},
		{"model not a string", `{"model":3}`, true, parsed{}, `"model" must be a string, got a number`},
		{"negative", `{"model":"m","max_tokens":-3}`, true, parsed{}, `"max_tokens" must not be negative`},
		{"max_tokens -1 refused", `{"model":"m","max_tokens":-1}`, true, parsed{}, `"max_tokens" must not be negative, got -1`},
		{"n_predict -1 is llama.cpp's no limit", `{"prompt":"x","n_predict":-1}`, false, parsed{}, ""},
		{"n_predict below -1", `{"prompt":"x","n_predict":-2}`, false, parsed{}, `"n_predict" must be -1 (no limit) or more, got -2`},
		{"first positive limit wins", `{"model":"m","max_tokens":0,"max_completion_tokens":7,"max_output_tokens":9}`, true, parsed{model: "m", maxTokens: 7}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseInference([]byte(tt.body), tt.needModel, nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.model != tt.want.model || got.stream != tt.want.stream || got.maxTokens != tt.want.maxTokens || got.promptTokens < 1 {
				t.Fatalf("got %+v, want %+v with a positive prompt estimate", got, tt.want)
			}
		})
	}
}

// meterLines feeds stream to a streamMeter one line at a time and ends
// it; firstLine is the index of the line whose feed reported the first
// content (the blank line that dispatched its event), -1 for none, -2 for
// more than one.
func meterLines(stream string) (m *streamMeter, firstLine int) {
	m = &streamMeter{read: readEvent}
	firstLine = -1
	note := func(i int, first bool) {
		switch {
		case first && firstLine == -1:
			firstLine = i
		case first:
			firstLine = -2
		}
	}
	lines := strings.SplitAfter(stream, "\n")
	for i, l := range lines {
		note(i, m.feed([]byte(l)))
	}
	m.end()
	note(len(lines), m.first)
	return m, firstLine
}

func TestStreamMeter(t *testing.T) {
	tests := []struct {
		name      string
		stream    string
		tokens    int
		failed    bool
		firstLine int // index of the line that ended the first content event, -1 none
	}{
		{"openai chunks counted", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n", 2, false, 3},
		{"usage wins over counting", "data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n", 7, false, 1},
		{"native content", "data: {\"content\":\"x\",\"stop\":false}\n\ndata: {\"content\":\"\",\"stop\":true,\"timings\":{\"predicted_n\":3}}\n", 3, false, 1},
		{"completions text", "data: {\"choices\":[{\"text\":\"x\"}]}\n\n", 1, false, 1},
		{"error object in data", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"kv cache full\"}}\n\n", 1, true, 1},
		{"error event", "event: error\ndata: {\"message\":\"boom\"}\n\n", 0, true, -1},
		{"null error is fine", "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", 1, false, 1},
		{"multi-line data is one event", "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"a\"}}]}\n\n", 1, false, 2},
		{"comments and CRLF", ": ping\r\ndata: {\"content\":\"x\"}\r\n\r\n", 1, false, 2},
		{"last event dispatched at the end", "data: {\"content\":\"x\"}", 1, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, first := meterLines(tt.stream)
			if m.tokens() != tt.tokens || m.failed != tt.failed || first != tt.firstLine {
				t.Fatalf("tokens %d failed %v first line %d; want %d %v %d", m.tokens(), m.failed, first, tt.tokens, tt.failed, tt.firstLine)
			}
		})
	}
}

// FuzzParseInference holds the request parsers to their contract on any
// body: what they accept has a model, no negative limit and a prompt of
// at least one token, and a chat request accepted has messages, each with
// a role; what they refuse is a *badRequest whose message names no Go
// type, and whose param, when set, is a key of the body (down to a
// message's field) or a required field it lacks.
func FuzzParseInference(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	f.Add([]byte(`{"prompt":"x","n_predict":-1}`))
	f.Add([]byte(`{"model":"m","stream":"yes"}`))
	f.Add([]byte(`[{"model":"m"}]`))
	f.Add([]byte(`{"model":7,"max_tokens":2.5}`))
	f.Add([]byte(`{"model":"m","messages":"hi"}`))
	f.Add([]byte(`{"model":"m","messages":[]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},"b",null]}`))
	f.Add([]byte(`{"model":"m","messages":[{"Role":1},{"role":""}]}`))
	f.Add([]byte(`{"model":"m","messages":"bad","messages":[{"role":"user"}]}`))
	f.Add([]byte(`{"model":"m","prompt":5}`))
	f.Add([]byte(`{"model":"m","prompt":null,"prompt_embeds":"AAAA"}`))
	f.Add([]byte(`{"model":"m","prompt":{"prompt_string":"x","multimodal_data":[]}}`))
	parsers := map[string]func([]byte) (parsed, error){
		"inference":  func(b []byte) (parsed, error) { return parseInference(b, true, nil) },
		"chat":       func(b []byte) (parsed, error) { return parseInference(b, true, requireMessages) },
		"completion": func(b []byte) (parsed, error) { return parseInference(b, true, requirePrompt) },
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for name, parse := range parsers {
			p, err := parse(b)
			if err == nil {
				if p.model == "" || p.maxTokens < 0 || p.promptTokens < 1 {
					t.Fatalf("%s accepted %q as %+v", name, b, p)
				}
				if name == "chat" && checkMessages(rawMessages(b)).kind != noFault {
					t.Fatalf("chat accepted %q, whose messages are %+v", b, checkMessages(rawMessages(b)))
				}
				continue
			}
			var bad *badRequest
			if !errors.As(err, &bad) || bad.msg == "" {
				t.Fatalf("%s refused %q with %T %v, want a *badRequest with a message", name, b, err, err)
			}
			for _, goSpeak := range []string{"Go struct", "Go value", "inference.", "of type", "unmarshal"} {
				if strings.Contains(bad.msg, goSpeak) {
					t.Fatalf("%s refused %q with %q: speaks Go", name, b, bad.msg)
				}
			}
			key, _, _ := strings.Cut(bad.param, "[")
			key, _, _ = strings.Cut(key, ".")
			required := key == "model" || key == "messages" || key == "prompt"
			if key != "" && !required && !bytes.Contains(bytes.ToLower(b), []byte(strings.ToLower(key))) {
				t.Fatalf("%s refused %q naming param %q, which it does not hold", name, b, bad.param)
			}
		}
	})
}

// feed parses the next bytes of the stream and reports whether they held
// its first content (the relay feeds its own parser: part.feed).
func (m *streamMeter) feed(b []byte) (first bool) {
	m.first = false
	m.parser.Feed(b, func(e sse.Event) { m.take(e) })
	return m.first
}

// FuzzStreamMeter checks the meter on any stream: at most one first
// content, no negative count, and the same reading whether the stream
// comes whole, line by line, or split at any byte.
func FuzzStreamMeter(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n"), 3)
	f.Add([]byte("event: error\ndata: x\n"), 1)
	f.Add([]byte("data: {\"content\":\"x\",\"stop\":true,\"timings\":{\"predicted_n\":3,\"prompt_n\":2}}\r\n\r\n"), 10)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		lines, firstLine := meterLines(string(b))
		if firstLine == -2 || lines.tokens() < 0 {
			t.Fatalf("first line %d, %d tokens", firstLine, lines.tokens())
		}
		whole, split := streamMeter{read: readEvent}, streamMeter{read: readEvent}
		whole.feed(b)
		whole.end()
		cut = min(max(cut, 0), len(b))
		split.feed(b[:cut])
		split.feed(b[cut:])
		split.end()
		read := func(m *streamMeter) [6]any {
			return [6]any{m.tokens(), m.prompt, m.done, m.finished, m.failed, m.failure}
		}
		if a, b, c := read(lines), read(&whole), read(&split); a != b || b != c {
			t.Fatalf("line by line %v, whole %v, split at %d %v", a, b, cut, c)
		}
	})
}

func TestObservation_WholeAnswersTeachWhatTheyCan(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name string
		m    measured
		e2e  time.Duration
		want stats.Observation
	}{
		{"stream: decode rate from the first token", measured{ttft: sec, tokens: 11}, 3 * sec,
			stats.Observation{TTFT: sec, E2E: 3 * sec, OutputTokens: 11, DecodeTPS: 5}},
		{"whole answer without timings: end-to-end and length", measured{tokens: 40}, 2 * sec,
			stats.Observation{E2E: 2 * sec, OutputTokens: 40}},
		{"whole llama.cpp answer: first token where decoding began", measured{tokens: 20, timings: &timings{PromptMs: 300, PredictedN: 20, PredictedMs: 1000, PredictedPerSecond: 20}}, 1500 * time.Millisecond,
			stats.Observation{TTFT: 500 * time.Millisecond, E2E: 1500 * time.Millisecond, OutputTokens: 20, DecodeTPS: 20}},
		{"rate from predicted_n and predicted_ms", measured{tokens: 10, timings: &timings{PredictedN: 10, PredictedMs: 500}}, sec,
			stats.Observation{TTFT: 500 * time.Millisecond, E2E: sec, OutputTokens: 10, DecodeTPS: 20}},
		{"prompt_ms alone", measured{tokens: 1, timings: &timings{PromptMs: 250}}, sec,
			stats.Observation{TTFT: 250 * time.Millisecond, E2E: sec, OutputTokens: 1}},
		{"timings longer than the request are not believed", measured{tokens: 5, timings: &timings{PromptMs: 5000, PredictedMs: 9000}}, sec,
			stats.Observation{E2E: sec, OutputTokens: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, observation(tt.m, tt.e2e)); diff != "" {
				t.Fatalf("observation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseInference_PromptCountsTextOnly(t *testing.T) {
	image := "data:image/png;base64," + strings.Repeat("iVBORw0KGgo", 20000) // ~220 KB of base64
	text := strings.Repeat("abcd", 100)                                      // 400 chars: 100 tokens
	tests := []struct {
		name string
		body string
		want int
	}{
		{"chat string content", `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`, 100 + messageTokens},
		{"chat text and image parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"},{"type":"image_url","image_url":{"url":"` + image + `"}}]}]}`, 100 + mediaTokens + messageTokens},
		{"two messages, JSON syntax free", `{"model":"m","messages":[{"role":"system","content":"` + text + `"},{"role":"user","content":"` + text + `"}]}`, 200 + 2*messageTokens},
		{"prompt string", `{"model":"m","prompt":"` + text + `"}`, 100},
		{"prompt array of strings", `{"model":"m","prompt":["` + text + `","` + text + `"]}`, 200},
		{"prompt token ids", `{"model":"m","prompt":[1,2,3,4,5]}`, 5},
		{"embeddings input", `{"model":"m","input":["` + text + `"]}`, 100},
		{"responses input with an image", `{"model":"m","instructions":"` + text + `","input":[{"role":"user","content":[{"type":"input_text","text":"` + text + `"},{"type":"input_image","image_url":"` + image + `"}]}]}`, 200 + mediaTokens + messageTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseInference([]byte(tt.body), true, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.promptTokens != tt.want {
				t.Fatalf("prompt tokens %d, want %d (body %d bytes)", p.promptTokens, tt.want, len(tt.body))
			}
		})
	}
}

func TestStreamMeter_CompleteAtItsEnd(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   bool
	}{
		{"[DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n", true},
		{"final chunk, before usage and [DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n", true},
		{"native stop", "data: {\"content\":\"x\",\"stop\":false}\n\ndata: {\"content\":\"\",\"stop\":true}\n", true},
		{"content only", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n", false},
		{"native, not stopped", "data: {\"content\":\"x\",\"stop\":false}\n", false},
		{"error event then [DONE]", "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := meterLines(tt.stream)
			if got := m.complete(); got != tt.want {
				t.Fatalf("complete = %v, want %v", got, tt.want)
			}
		})
	}
}
