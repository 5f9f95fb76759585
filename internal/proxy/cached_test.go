package proxy

import "testing"

// Each engine's way of saying how much of the prompt it found cached is
// read, and an answer that does not say is not taken for zero.
func TestReadEvent_CachedTokens(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       int
		known      bool
	}{
		{"vLLM usage", `{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":768}}}`, 768, true},
		{"usage saying zero", `{"choices":[],"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens":0}}}`, 0, true},
		{"Responses usage", `{"usage":{"input_tokens":900,"output_tokens":4,"input_tokens_details":{"cached_tokens":512}}}`, 512, true},
		{"llama.cpp timings", `{"choices":[{"finish_reason":"stop","delta":{}}],"timings":{"prompt_n":132,"cache_n":768}}`, 768, true},
		{"usage without details", `{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":4}}`, 0, false},
		{"a token", `{"choices":[{"delta":{"content":"hi"}}]}`, 0, false},
	} {
		got := readEvent([]byte(tc.data))
		if got.cached != tc.want || got.cachedKnown != tc.known {
			t.Errorf("%s: cached %d (known %v), want %d (%v)", tc.name, got.cached, got.cachedKnown, tc.want, tc.known)
		}
	}
	a := readAnthropicEvent([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":640}}}`))
	if a.cached != 640 || !a.cachedKnown {
		t.Errorf("Anthropic message_start: cached %d (known %v), want 640", a.cached, a.cachedKnown)
	}
}
