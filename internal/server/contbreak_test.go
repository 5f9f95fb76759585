package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// contIdle is the stream idle timeout of the stall tests: far above a
// token's time at the sims' scale of 200 (well under a millisecond), and
// above a continuation's first byte on a 2-core machine running the whole
// suite under the race detector, so only the stalled worker's silence
// reaches it.
const contIdle = 400 * time.Millisecond

// readsAsUninterrupted checks that got reads as the uninterrupted stream
// of form f — the sim's reference text, its token count and usage, one
// id, one role, the same end — and that no lease is left held.
func readsAsUninterrupted(t *testing.T, r *router, got streamRead, f struct{ name, kind, path, body string }, k int) {
	t.Helper()
	want, n, err := sim.Reference(f.path, []byte(f.body), contParams(4), emulateOf(f.kind))
	if err != nil {
		t.Fatal(err)
	}
	if got.text != want || got.contents != n || got.completion != n || got.errorEvent != "" {
		t.Errorf("k=%d: read %d tokens %q (usage %d, error %s), want %d: %q", k, got.contents, got.text, got.completion, got.errorEvent, n, want)
	}
	if len(got.ids) > 1 || got.roles > 1 || got.done != (f.path != "/completion") || got.stop != (f.path == "/completion") {
		t.Errorf("k=%d: ids %v, %d role chunks, [DONE] %v stop %v; want one id, at most one role, the route's end", k, got.ids, got.roles, got.done, got.stop)
	}
	idle(t, r)
}

// A worker that goes silent mid-stream — its connection held open, no
// byte for proxy.stream_idle_timeout — is cut off at the timeout and the
// stream continued on another worker: for each kind that can continue,
// at the first token and mid-way, it reads exactly as the uninterrupted
// stream, the record says stream_idle, and the silent worker is blamed.
func TestContinuation_StalledWorkerIsContinued(t *testing.T) {
	for _, f := range contForms {
		t.Run(f.name, func(t *testing.T) {
			ws := startSimWorkers(t, contParams(4), 200, f.kind, f.kind)
			release := make(chan struct{}) // the stalled handler waits on it, or on the router hanging up
			t.Cleanup(func() { close(release) })
			_, n, _ := sim.Reference(f.path, []byte(f.body), contParams(4), emulateOf(f.kind))
			for _, k := range []int{1, n / 2} {
				r := startRouter(t, contConfig(t, ws, 4, func(c *config.Config) { c.Proxy.StreamIdleTimeout = contIdle }))
				ws[0].srv.StallStreams(k, 1, release)
				got := readStream(t, postPath(t, context.Background(), r.url, f.path, f.body), nil)
				readsAsUninterrupted(t, r, got, f, k)
				c, ok := continuationOf(r)
				if !ok || c.From != "w0" || c.CarriedTokens != k || c.Outcome != "ok" || c.Reason != "stream_idle" {
					t.Errorf("k=%d: record's continuation %+v (found %v), want from w0, %d carried, stream_idle, ok", k, c, ok, k)
				}
				if st := r.srv.fleet.Get("w0").State(); st.ConsecutiveFailures != 1 || !strings.Contains(st.Reason, "sent nothing") {
					t.Errorf("k=%d: w0's state %+v: want one failure saying it sent nothing", k, st)
				}
				r.stop(t)
			}
		})
	}
}

// A worker that reports an error mid-stream (vLLM's
// data: {"error":{"message":"boom","type":"server_error",...}}, then
// [DONE]) has its stream continued elsewhere: the client never sees the
// error event nor that worker's [DONE], and reads exactly the
// uninterrupted stream; the record says error_event.
func TestContinuation_ErrorEventIsContinued(t *testing.T) {
	for _, f := range contForms {
		if f.path == "/completion" {
			continue // llama.cpp's native route: not OpenAI's error event
		}
		t.Run(f.name, func(t *testing.T) {
			ws := startSimWorkers(t, contParams(4), 200, f.kind, f.kind)
			_, n, _ := sim.Reference(f.path, []byte(f.body), contParams(4), emulateOf(f.kind))
			for _, k := range []int{1, n / 2, n} {
				r := startRouter(t, contConfig(t, ws, 4, nil))
				ws[0].srv.ErrorStreams(k, 1)
				got := readStream(t, postPath(t, context.Background(), r.url, f.path, f.body), nil)
				readsAsUninterrupted(t, r, got, f, k)
				c, ok := continuationOf(r)
				if !ok || c.From != "w0" || c.CarriedTokens != k || c.Outcome != "ok" || c.Reason != "error_event" {
					t.Errorf("k=%d: record's continuation %+v (found %v), want from w0, %d carried, error_event, ok", k, c, ok, k)
				}
				r.stop(t)
			}
		})
	}
}

// toolCallWorker is a llama.cpp worker (a sim, for its probes) whose chat
// stream begins an answer, starts a tool call, and dies.
type toolCallWorker struct{ sim *simWorker }

func (w toolCallWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		w.sim.ServeHTTP(rw, r)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	for _, e := range []string{
		`{"id":"chatcmpl-tool","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
		`{"id":"chatcmpl-tool","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Let me look."}}]}`,
		`{"id":"chatcmpl-tool","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]}}]}`,
		`{"id":"chatcmpl-tool","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
	} {
		io.WriteString(rw, "data: "+e+"\n\n")
	}
	rw.(http.Flusher).Flush()
	panic(http.ErrAbortHandler) // the worker dies mid tool call
}

// A stream whose worker dies once a tool call began (delta.tool_calls)
// is not continued — an assistant prefix cannot say the model was midway
// through a call — even with a worker free that could continue it: the
// client gets the events relayed, the tool call's included, then Sluice's
// upstream_failed error event and no [DONE], as before continuation
// existed; no continuation is recorded and every lease is freed.
func TestContinuation_ToolCallIsNotContinued(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
	// w0 is a sim behind toolCallWorker (a handler of its own from the
	// start: one swapped into a running server would race its reads).
	srv, err := sim.NewServer(contParams(4), sim.Options{TimeScale: 200, Name: "w0"})
	if err != nil {
		t.Fatal(err)
	}
	ws[0] = &simWorker{name: "w0", kind: "llamacpp", srv: srv}
	ws[0].hs = httptest.NewServer(toolCallWorker{ws[0]})
	t.Cleanup(func() {
		srv.Close()
		ws[0].hs.Close()
	})
	r := startRouter(t, contConfig(t, ws, 4, nil))
	body := `{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"weather"}}],"messages":[{"role":"user","content":"weather in Oslo?"}]}`
	resp := postPath(t, context.Background(), r.url, "/v1/chat/completions", body)
	if w := resp.Header.Get("X-Sluice-Worker"); w != "w0" {
		t.Fatalf("served by %q, want w0 (the first listed)", w)
	}
	raw := readAll(t, resp)
	if !strings.Contains(raw, `"Let me look."`) || !strings.Contains(raw, `{\"city\":`) {
		t.Errorf("the client did not get the events before the break: %s", raw)
	}
	if !strings.Contains(raw, `"code":"upstream_failed"`) || strings.Contains(raw, "[DONE]") {
		t.Errorf("stream ended %q; want Sluice's upstream_failed error event and no [DONE]", raw[max(len(raw)-200, 0):])
	}
	if c, ok := continuationOf(r); ok {
		t.Errorf("a continuation was recorded: %+v", c)
	}
	if m := ws[1].srv.Metrics(); m.Finished+m.Cancelled+int64(m.RequestsProcessing) != 0 {
		t.Errorf("w1 was sent a continuation: %+v", m)
	}
	idle(t, r)
}
