package sim

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"
)

// A stream told to stall after k tokens sends exactly k, then holds the
// connection open with nothing more until released; it then ends without
// its end ([DONE] or a finish reason).
func TestServer_StallStreamsHoldsAfterTokenK(t *testing.T) {
	srv, hs := newTestServer(t, testParams(), 1000)
	release := make(chan struct{})
	srv.StallStreams(3, 1, release)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":10,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, testParams().Model)
	resp := post(t, hs.URL+"/v1/chat/completions", body)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for n := 0; n < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d tokens: %v", n, err)
		}
		if strings.Contains(line, `"content"`) {
			n++
		}
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if strings.Contains(string(rest), `"content"`) || strings.Contains(string(rest), "[DONE]") || strings.Contains(string(rest), `"finish_reason":"`) {
		t.Fatalf("the stalled stream went on after its 3 tokens: %s", rest)
	}
	if whole := streamAnswer(t, hs.URL, "/v1/chat/completions", body); len(whole.tokens) != 10 {
		t.Fatalf("the next stream had %d tokens, want 10", len(whole.tokens))
	}
}

// A stream told to fail after k tokens sends k, then vLLM's error event
// and [DONE].
func TestServer_ErrorStreamsSendsAnErrorEvent(t *testing.T) {
	srv, hs := newTestServer(t, testParams(), 1000)
	srv.ErrorStreams(4, 1)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":10,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, testParams().Model)
	resp := post(t, hs.URL+"/v1/chat/completions", body)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if n := strings.Count(s, `"content"`); n != 4 || !strings.HasSuffix(s, faultErrorEvent) {
		t.Fatalf("stream held %d tokens (want 4) and ended %q, want the error event and [DONE]", n, s[max(len(s)-120, 0):])
	}
}
