package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// simAnswer is what one streamed answer said: its tokens, in order, and
// its usage.
type simAnswer struct {
	tokens             []string
	prompt, completion int
}

// streamAnswer posts body to path and reads the streamed answer, in the
// shape of whichever API path is.
func streamAnswer(t *testing.T, url, path, body string) simAnswer {
	t.Helper()
	resp := post(t, url+path, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %s: %s", path, resp.Status, b)
	}
	var a simAnswer
	for _, data := range sseEvents(t, resp.Body) {
		if data == "[DONE]" {
			continue
		}
		var c struct {
			openAIChunk
			Content         *string `json:"content"`
			TokensPredicted int     `json:"tokens_predicted"`
			TokensEvaluated int     `json:"tokens_evaluated"`
			Stop            bool    `json:"stop"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		text := ""
		if c.Content != nil {
			text = *c.Content
		}
		for _, ch := range c.Choices {
			text += ch.Delta.Content + ch.Text
		}
		if text != "" {
			a.tokens = append(a.tokens, text)
		}
		if c.Usage != nil {
			a.prompt, a.completion = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		if c.Stop {
			a.prompt, a.completion = c.TokensEvaluated, c.TokensPredicted
		}
	}
	return a
}

// An answer is a function of its question, and a question extended by
// the first k tokens of its answer, in each engine's form of asking to
// continue, is answered with exactly the rest: same tokens, the prompt
// longer by k, the completion shorter by k. A vLLM-like server continues
// a trailing assistant message only when asked to.
func TestServer_ContinuationWritesTheRestOfTheAnswer(t *testing.T) {
	p := testParams()
	p.OutputMedian, p.OutputSigma, p.OutputMin, p.OutputMax = 20, 0.5, 5, 60
	llama, err := NewServer(p, Options{TimeScale: 1000, Name: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	vllm, err := NewServer(p, Options{TimeScale: 1000, Name: "vllm", Emulate: "vllm"})
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	for name, s := range map[string]*Server{"llama": llama, "vllm": vllm} {
		_, hs := serve(t, s)
		urls[name] = hs
	}
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":"tell me about GPUs"}]`
	withPrefill := func(sent string, extra string) string {
		m := strings.TrimSuffix(msgs, "]") + fmt.Sprintf(`,{"role":"assistant","content":%q}]`, sent)
		return fmt.Sprintf(`{"model":%q,"stream":true,"messages":%s%s}`, p.Model, m, extra)
	}
	forms := []struct {
		name, worker, path string
		fresh              string
		cont               func(sent string) string
	}{
		{"llama.cpp chat, assistant prefill", "llama", "/v1/chat/completions",
			fmt.Sprintf(`{"model":%q,"stream":true,"messages":%s}`, p.Model, msgs),
			func(sent string) string { return withPrefill(sent, "") }},
		{"vLLM chat, continue_final_message", "vllm", "/v1/chat/completions",
			fmt.Sprintf(`{"model":%q,"stream":true,"messages":%s}`, p.Model, msgs),
			func(sent string) string {
				return withPrefill(sent, `,"continue_final_message":true,"add_generation_prompt":false`)
			}},
		{"/v1/completions, prompt extended", "vllm", "/v1/completions",
			fmt.Sprintf(`{"model":%q,"stream":true,"prompt":"Once upon a time"}`, p.Model),
			func(sent string) string {
				return fmt.Sprintf(`{"model":%q,"stream":true,"prompt":%q}`, p.Model, "Once upon a time"+sent)
			}},
		{"llama.cpp /completion, prompt extended", "llama", "/completion",
			`{"stream":true,"prompt":"Once upon a time"}`,
			func(sent string) string { return fmt.Sprintf(`{"stream":true,"prompt":%q}`, "Once upon a time"+sent) }},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			url := urls[f.worker]
			whole := streamAnswer(t, url, f.path, f.fresh)
			n := len(whole.tokens)
			if n < 5 || whole.completion != n {
				t.Fatalf("uninterrupted answer: %d tokens, usage says %d", n, whole.completion)
			}
			if again := streamAnswer(t, url, f.path, f.fresh); strings.Join(again.tokens, "") != strings.Join(whole.tokens, "") {
				t.Fatalf("asked twice, answered differently:\n%q\n%q", whole.tokens, again.tokens)
			}
			for _, k := range []int{1, 2, n / 2, n - 1, n} {
				sent := strings.Join(whole.tokens[:k], "")
				rest := streamAnswer(t, url, f.path, f.cont(sent))
				if got, want := strings.Join(rest.tokens, ""), strings.Join(whole.tokens[k:], ""); got != want {
					t.Errorf("k=%d: continued with %q, want %q", k, got, want)
				}
				if rest.prompt != whole.prompt+k || rest.completion != n-k {
					t.Errorf("k=%d: usage prompt %d completion %d, want %d and %d", k, rest.prompt, rest.completion, whole.prompt+k, n-k)
				}
			}
		})
	}
	t.Run("vLLM without continue_final_message starts a new turn", func(t *testing.T) {
		fresh := fmt.Sprintf(`{"model":%q,"stream":true,"messages":%s}`, p.Model, msgs)
		whole := streamAnswer(t, urls["vllm"], "/v1/chat/completions", fresh)
		sent := strings.Join(whole.tokens[:2], "")
		other := streamAnswer(t, urls["vllm"], "/v1/chat/completions", withPrefill(sent, ""))
		if strings.Join(other.tokens, "") == strings.Join(whole.tokens[2:], "") {
			t.Fatal("a vLLM-like worker continued a trailing assistant message it was not asked to continue")
		}
		resp := post(t, urls["vllm"]+"/v1/chat/completions", withPrefill(sent, `,"continue_final_message":true`))
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("continue_final_message with the default add_generation_prompt: %s, want 400 as vLLM", resp.Status)
		}
	})
}

// serve runs s behind a test server, closed with the test.
func serve(t *testing.T, s *Server) (*Server, string) {
	t.Helper()
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	<-s.Ready()
	return s, hs.URL
}

// A stream told to abort after k tokens sends exactly k and is cut: the
// client reads an error, not the stream's end.
func TestServer_AbortStreamsCutsAtTokenK(t *testing.T) {
	srv, hs := newTestServer(t, testParams(), 1000)
	srv.AbortStreams(3, 1)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":10,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, testParams().Model)
	resp := post(t, hs.URL+"/v1/chat/completions", body)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("the aborted stream ended cleanly: %s", b)
	}
	if n := strings.Count(string(b), `"content"`); n != 3 || strings.Contains(string(b), "[DONE]") {
		t.Fatalf("aborted stream held %d tokens (want 3), [DONE] %v:\n%s", n, strings.Contains(string(b), "[DONE]"), b)
	}
	// The fault was for one stream: the next is whole.
	whole := streamAnswer(t, hs.URL, "/v1/chat/completions", body)
	if len(whole.tokens) != 10 {
		t.Fatalf("the next stream had %d tokens, want 10", len(whole.tokens))
	}
}
