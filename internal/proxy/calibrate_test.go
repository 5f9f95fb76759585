package proxy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chatOf is a chat request of one message of text.
func chatOf(t *testing.T, text string) parsed {
	t.Helper()
	p, err := parseInference([]byte(`{"model":"m","messages":[{"role":"user","content":"`+text+`"}]}`), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenRatio_LearnsFromWhatWorkersCounted(t *testing.T) {
	words400 := strings.Repeat("abc ", 400) // 1,600 characters: 404 tokens at text/4
	long := strings.Repeat("abcdef ", 857)  // 5,999 characters
	tests := []struct {
		name    string
		samples []int // tokens the worker counted for words400, in order
		prompt  string
		want    int // 0: no calibrated estimate
	}{
		{"nothing counted yet: text/4 stands", nil, long, 0},
		// llama-server counted 828: (828-4)/1600 = 0.515 tokens/char.
		{"one count", []int{828}, long, 3094},
		// then (404-4)/1600 = 0.25: 0.515 + 0.2 × (0.25 - 0.515) = 0.462.
		{"a moving average, not the last count", []int{828, 404}, long, 2776},
		{"an unbelievable count teaches nothing", []int{828, 1_000_000}, long, 3094},
		{"a count below the template's own tokens teaches nothing", []int{3}, long, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTokenRatio()
			for _, n := range tt.samples {
				r.observe(chatOf(t, words400), n)
			}
			got, src, ok := r.estimate(chatOf(t, tt.prompt))
			if tt.want == 0 {
				if ok {
					t.Fatalf("estimate %d (%s), want none", got, src)
				}
				return
			}
			if !ok || got != tt.want || !strings.HasPrefix(src, SourceCalibrated) {
				t.Fatalf("estimate %d ok %v source %q, want %d from %q", got, ok, src, tt.want, SourceCalibrated)
			}
		})
	}
}

func TestTokenRatio_ShortPromptsAndOtherModelsAreApart(t *testing.T) {
	r := newTokenRatio()
	r.observe(chatOf(t, "hello there"), 40) // template tokens swamp 11 characters
	if _, _, ok := r.estimate(chatOf(t, strings.Repeat("x", 1000))); ok {
		t.Fatal("a short prompt calibrated the estimate")
	}
	r.observe(chatOf(t, strings.Repeat("abcd", 100)), 204) // 0.5 tokens/char for m
	other := chatOf(t, strings.Repeat("abcd", 100))
	other.model = "other"
	if _, _, ok := r.estimate(other); ok {
		t.Fatal("model m's ratio was used for another model")
	}
	if n, _, ok := r.estimate(chatOf(t, strings.Repeat("abcd", 100))); !ok || n != 204 {
		t.Fatalf("estimate %d ok %v, want 204", n, ok)
	}
}

func TestChunk_PromptCountFromEveryPlaceAWorkerSaysIt(t *testing.T) {
	tests := []struct {
		name, json string
		want       int
	}{
		{"usage", `{"usage":{"prompt_tokens":828,"completion_tokens":3}}`, 828},
		{"llama.cpp timings of a stream without usage", `{"choices":[],"timings":{"cache_n":12,"prompt_n":816,"prompt_ms":90}}`, 828},
		{"usage wins over timings", `{"usage":{"prompt_tokens":828},"timings":{"prompt_n":5}}`, 828},
		{"llama.cpp's 400 for a prompt over its slot", readGolden(t, "llamacpp_error_exceed_context.json"), 3028},
		{"an error without a count", `{"error":{"code":500,"message":"boom"}}`, 0},
		{"nothing", `{"choices":[{"delta":{"content":"a"}}]}`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c chunk
			if err := jsonUnmarshal(tt.json, &c); err != nil {
				t.Fatal(err)
			}
			if got := c.promptCount(); got != tt.want {
				t.Fatalf("promptCount = %d, want %d", got, tt.want)
			}
		})
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// readGolden reads a worker payload from the telemetry package's golden
// files, so the proxy reads the same real formats.
func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "telemetry", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
