package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"
	"time"
)

// chatStream is an OpenAI chat stream of n content events as llama-server
// writes them, with its final chunk, usage and [DONE].
func chatStream(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}` + "\n\n")
	for i := range n {
		fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" word%d"}}],"created":1,"id":"chatcmpl-x","model":"m","system_fingerprint":"b1-de3ff81","object":"chat.completion.chunk"}`+"\n\n", i)
	}
	b.WriteString(`data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":200,"prompt_tokens":12,"total_tokens":212}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkRelay relays a 200-token chat stream as a worker would write
// it, event by event: plain (a route or kind that cannot be continued,
// relayed as it comes) and continuable (whole events at a time, the text
// sent followed so that another worker could be asked for the rest).
// ns/op is per stream.
func BenchmarkRelay(b *testing.B) {
	stream := chatStream(200)
	for _, tt := range []struct {
		name  string
		relay func(*httptest.ResponseRecorder, *eventReader) error
	}{
		{"plain", func(w *httptest.ResponseRecorder, r *eventReader) error {
			_, err := relayStream(w, r, time.Now(), openAI, failureText{})
			return err
		}},
		{"continuable", func(w *httptest.ResponseRecorder, r *eventReader) error {
			cs := &contStream{proto: openAI, route: routeChat, left: 1}
			_, err := cs.relay(w, r, time.Now())
			return err
		}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				if err := tt.relay(w, &eventReader{b: stream}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// eventReader returns b one SSE event per Read, as a worker's flushes
// arrive.
type eventReader struct {
	b []byte
}

func (r *eventReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	end := bytes.Index(r.b, []byte("\n\n"))
	if end < 0 {
		end = len(r.b)
	} else {
		end += 2
	}
	n := copy(p, r.b[:min(end, len(p))])
	r.b = r.b[n:]
	return n, nil
}
