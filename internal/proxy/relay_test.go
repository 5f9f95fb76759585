package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRelayWhole_LargeAnswerRelayedWholeUsageFromTail(t *testing.T) {
	// An embeddings-sized answer larger than what is kept for parsing,
	// with usage at its end.
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	const limit = 64 << 10
	for i := 0; b.Len() < 3*limit; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":[0.125,0.25,0.5,1]}`, i)
	}
	b.WriteString(`],"usage":{"prompt_tokens":9,"completion_tokens":7},"timings":{"predicted_n":7,"predicted_ms":70}}`)
	want := b.String()
	rec := httptest.NewRecorder()
	m, err := relayWhole(rec, strings.NewReader(want), limit)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.String(); got != want {
		t.Fatalf("client got %d bytes, want the worker's %d unchanged", len(got), len(want))
	}
	if m.tokens != 7 || m.timings == nil || m.timings.PredictedMs != 70 {
		t.Fatalf("measured %+v (timings %+v): want 7 tokens and predicted_ms 70 from the tail", m, m.timings)
	}
}

func TestCapture_KeepsAtMostItsLimit(t *testing.T) {
	c := capture{limit: 1000}
	piece := bytes.Repeat([]byte("x"), 97)
	for range 100 {
		c.Write(piece)
		if len(c.buf) > c.limit {
			t.Fatalf("kept %d bytes, limit %d", len(c.buf), c.limit)
		}
	}
	c.Write([]byte(`"usage" : {"completion_tokens":3}}`))
	var ch chunk
	if !c.parse(&ch) || ch.reportedTokens() != 3 {
		t.Fatalf("parse of the tail: %+v", ch.Usage)
	}
}

// slowBody yields its first part, then waits for next before the rest.
type slowBody struct {
	first, rest []byte
	next        chan struct{}
}

func (s *slowBody) Read(p []byte) (int, error) {
	if len(s.first) > 0 {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	if s.next != nil {
		<-s.next
		s.next = nil
	}
	if len(s.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.rest)
	s.rest = s.rest[n:]
	return n, nil
}

// recorderWriter tells when the client has been sent its first bytes.
type recorderWriter struct {
	*httptest.ResponseRecorder
	wrote chan struct{}
}

func (r *recorderWriter) Write(p []byte) (int, error) {
	n, err := r.ResponseRecorder.Write(p)
	select {
	case r.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func TestRelayWhole_RelaysBeforeTheAnswerEnds(t *testing.T) {
	body := &slowBody{first: []byte(`{"choices":[{"text":"` + strings.Repeat("a", 1000)), rest: []byte(`"}],"usage":{"completion_tokens":2}}`), next: make(chan struct{})}
	w := &recorderWriter{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{}, 1)}
	done := make(chan measured)
	go func() {
		m, _ := relayWhole(w, body, maxParse)
		done <- m
	}()
	<-w.wrote // the client has bytes while the worker is still answering
	close(body.next)
	if m := <-done; m.tokens != 2 {
		t.Fatalf("tokens %d, want 2", m.tokens)
	}
}

// TestRelayStream_RealLlamaCppStream relays a stream a real llama-server
// sent: unchanged, its usage read from the last chunk, complete.
func TestRelayStream_RealLlamaCppStream(t *testing.T) {
	in, err := os.ReadFile("../telemetry/testdata/llamacpp-real-a-chat-stream.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{len(in), 1, 100} {
		rec := httptest.NewRecorder()
		m, err := relayStream(rec, &chunkReader{b: in, size: size}, time.Now(), openAI, failureText{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Body.Bytes(), in) {
			t.Fatalf("read %d at a time: the client got other bytes than the worker sent", size)
		}
		if m.tokens != 8 || m.promptTokens != 11 || !m.complete || m.ttft <= 0 {
			t.Fatalf("read %d at a time: measured %+v; want 8 tokens, 11 prompt tokens, complete, a first token", size, m)
		}
	}
}

// chunkReader yields b at most size bytes per Read.
type chunkReader struct {
	b    []byte
	size int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.b)
	c.b = c.b[n:]
	return n, nil
}

// relayStream relays body as the handler relays a stream that cannot be
// continued: as it comes, ended with Sluice's error event when it breaks.
func relayStream(w http.ResponseWriter, body io.Reader, start time.Time, proto *protocol, ft failureText) (measured, error) {
	cs := &contStream{proto: proto}
	m, err := cs.relay(w, body, start)
	var brk *streamBreak
	if errors.As(err, &brk) {
		endStream(w, proto, ft, brk)
	}
	return m, err
}

// A stream that may be continued is metered as one that may not: the
// usage a worker sends after its final chunk gives the prompt, cached and
// output counts, and an error event after the end fails neither.
func TestRelay_MetersWhatFollowsTheEnd(t *testing.T) {
	in := "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"a\",\"choices\":[],\"usage\":{\"prompt_tokens\":77,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n" +
		"event: error\ndata: {\"error\":\"late\"}\n\n" +
		"data: [DONE]\n\n"
	for _, route := range []string{"", routeChat} {
		cs := &contStream{proto: openAI, route: route, left: 1}
		rec := httptest.NewRecorder()
		m, err := cs.relay(rec, strings.NewReader(in), time.Now())
		if err != nil || !m.complete || m.tokens != 5 || m.promptTokens != 77 || m.cachedTokens != 64 || !m.cachedKnown {
			t.Errorf("route %q: measured %+v, err %v; want complete, 5 tokens, prompt 77 with 64 cached", route, m, err)
		}
		if route != "" && cs.emitted() != 5 {
			t.Errorf("route %q: emitted %d, want the worker's 5", route, cs.emitted())
		}
		if rec.Body.String() != in {
			t.Errorf("route %q: relayed %q, want the stream as sent", route, rec.Body.String())
		}
	}
}
