package proxy

import (
	"bytes"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzRelayStream feeds arbitrary worker bytes through the SSE relay: it
// must never panic, must pass every byte on unchanged and in order (an
// error event of Sluice's own may only follow them), and must count no
// negative tokens.
func FuzzRelayStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: error\ndata: {\"error\":{\"message\":\"x\"}}\n\n"))
	f.Add([]byte("data: {not json\n\n: comment\r\ndata:\n"))
	f.Add(bytes.Repeat([]byte("x"), 40<<10)) // one line longer than the read buffer
	f.Add([]byte("data: {\"usage\":{\"completion_tokens\":-5}}\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rec := httptest.NewRecorder()
		m, _ := relayStream(rec, bytes.NewReader(in), time.Now(), openAI)
		out := rec.Body.Bytes()
		if !bytes.HasPrefix(out, in) {
			t.Fatalf("relay changed the stream:\nin  %q\nout %q", in, out)
		}
		if m.tokens < 0 || m.ttft < 0 {
			t.Fatalf("measured %+v", m)
		}
	})
}
