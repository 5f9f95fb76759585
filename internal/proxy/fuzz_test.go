package proxy

import (
	"encoding/json"

	"bytes"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/sse"
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
		m, _ := relayStream(rec, bytes.NewReader(in), time.Now(), openAI, failureText{})
		out := rec.Body.Bytes()
		if !bytes.HasPrefix(out, in) {
			t.Fatalf("relay changed the stream:\nin  %q\nout %q", in, out)
		}
		if m.tokens < 0 || m.ttft < 0 {
			t.Fatalf("measured %+v", m)
		}
	})
}

// FuzzContinuationRelay feeds any bytes a worker could send to the relay
// of a continuable stream, as its first part and as a continuation part.
// The first part sends whole events as they came, so what the client
// gets is a prefix of what the worker sent; a continuation part's
// events are rewritten, so what the client gets is whole events only
// (it ends at an event boundary), every chunk among them carries the
// first part's id, and the tokens the client is counted as having are
// never fewer than those carried over.
func FuzzContinuationRelay(f *testing.F) {
	f.Add([]byte("data: {\"id\":\"other\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\ndata: {\"id\":\"other\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"id\":\"other\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"), false, uint8(0))
	f.Add([]byte("data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: {\"id\":\"x\",\"choi"), true, uint8(4))
	f.Add([]byte("data: {\"content\":\"c\",\"stop\":false}\n\ndata: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":2,\"tokens_evaluated\":7}\n\n"), true, uint8(2))
	f.Add([]byte("data: {\"error\":{\"message\":\"boom\"}}\n\n"), true, uint8(1))
	f.Add([]byte("data: {\"id\":\"y\",\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n"), false, uint8(0))
	f.Fuzz(func(t *testing.T, in []byte, cont bool, carried uint8) {
		const first = "chatcmpl-first"
		cs := &contStream{proto: openAI, route: routeChat, left: 1}
		if cont {
			cs.id, cs.cont, cs.sentAny, cs.carried = first, true, true, int(carried)
		}
		rec := httptest.NewRecorder()
		m, _ := cs.relay(rec, bytes.NewReader(in), time.Now())
		out := rec.Body.Bytes()
		if m.tokens < 0 || m.ttft < 0 {
			t.Fatalf("measured %+v", m)
		}
		if cs.emitted() < cs.carried {
			t.Fatalf("emitted %d, fewer than the %d carried", cs.emitted(), cs.carried)
		}
		if !cont {
			if !bytes.HasPrefix(in, out) {
				t.Fatalf("first part changed the stream:\nin  %q\nout %q", in, out)
			}
			return
		}
		if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n\n")) {
			t.Fatalf("continuation sent part of an event: %q", out)
		}
		var p sse.Parser
		p.Feed(out, func(e sse.Event) {
			var c struct {
				ID *string `json:"id"`
			}
			data := bytes.TrimSpace(e.Data)
			if !readEvent(data).valid || json.Unmarshal(data, &c) != nil || c.ID == nil {
				return
			}
			if *c.ID != first {
				t.Fatalf("continuation event with id %q, want the first part's %q: %q", *c.ID, first, data)
			}
		})
	})
}
