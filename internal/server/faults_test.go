package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// Each test here starts workers that misbehave in one way and checks the
// defined outcome; docs/reliability.md lists them.

// badWorker is an OpenAI-compatible worker on loopback whose inference
// answers are whatever serve writes; /v1/models always works.
func badWorker(t *testing.T, serve http.HandlerFunc) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		serve(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func faultConfig(t *testing.T, urls []string, edit func(*config.Config)) config.Config {
	return testConfig(t, nil, func(c *config.Config) {
		for i, u := range urls {
			c.Workers = append(c.Workers, config.Worker{Name: fmt.Sprintf("w%d", i+1), URL: u, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1})
		}
		if edit != nil {
			edit(c)
		}
	})
}

func workerState(t *testing.T, s *Server, name string) scheduler.WorkerState {
	t.Helper()
	for _, ws := range s.Scheduler().Workers() {
		if ws.Name == name {
			return ws
		}
	}
	t.Fatalf("no worker %s", name)
	return scheduler.WorkerState{}
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		io.WriteString(w, e)
		w.(http.Flusher).Flush()
	}
}

const tok = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"}}]}\n\n"

func TestFault_WorkerCrashesMidStream(t *testing.T) {
	var calls atomic.Int32
	u := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			sse(w, tok, tok)
			panic(http.ErrAbortHandler) // the process dies: connection cut mid-stream
		}
		sse(w, tok, "data: [DONE]\n\n")
	}).URL
	r := startRouter(t, faultConfig(t, []string{u}, nil))
	resp := post(t, context.Background(), r.url, chat("crash", true))
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, tok+tok) {
		t.Fatalf("status %d body %q: want the relayed tokens first", resp.StatusCode, body)
	}
	if !strings.Contains(body, `"code":"upstream_failed"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("body %q: want Sluice's error event and no [DONE]", body)
	}
	if ws := workerState(t, r.srv, "w1"); ws.Active != 0 {
		t.Fatalf("slot not freed: %d active", ws.Active)
	}
	// The only slot (max_concurrency 1) takes the next request.
	resp = post(t, context.Background(), r.url, chat("next", true))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("next request: %d %q", resp.StatusCode, body)
	}
}

func TestFault_WorkerHangsBeforeAnyByteIsRetriedElsewhere(t *testing.T) {
	hang := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}).URL
	good := badWorker(t, func(w http.ResponseWriter, r *http.Request) { sse(w, tok, "data: [DONE]\n\n") }).URL
	r := startRouter(t, faultConfig(t, []string{hang, good}, func(c *config.Config) {
		c.Policy = "round-robin" // both workers get first tries
		c.Proxy.ResponseHeaderTimeout = 200 * time.Millisecond
		c.Telemetry.FailThreshold = 100
	}))
	retried := 0
	for i := range 4 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), true))
		body := readAll(t, resp)
		if resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Worker") != "w2" || !strings.Contains(body, "[DONE]") {
			t.Fatalf("request %d: %d from %q: %q", i, resp.StatusCode, resp.Header.Get("X-Sluice-Worker"), body)
		}
		if resp.Header.Get("X-Sluice-Attempt") == "2" {
			retried++
		}
	}
	if retried == 0 {
		t.Fatal("no request was first sent to the hanging worker")
	}
	if fs := r.srv.fleet.Get("w1").State(); fs.ConsecutiveFailures != retried {
		t.Fatalf("hanging worker has %d failures counted, want %d", fs.ConsecutiveFailures, retried)
	}
}

func TestFault_WorkerDownIsRetriedElsewhere(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close() // connection refused from now on
	good := badWorker(t, func(w http.ResponseWriter, r *http.Request) { sse(w, tok, "data: [DONE]\n\n") }).URL
	r := startRouter(t, faultConfig(t, []string{dead, good}, func(c *config.Config) { c.Policy = "round-robin" }))
	for i := range 3 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), true))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	// Round-robin sends the first request to the dead worker: it answered
	// only because it was retried on the good one.
	var retries float64
	for _, m := range scrapeFamilies(t, r.url)["sluice_retries_total"].GetMetric() {
		retries += m.GetCounter().GetValue()
	}
	if retries < 1 {
		t.Fatalf("sluice_retries_total %v: the requests sent to the dead worker were not retried elsewhere", retries)
	}
}

func TestFault_MalformedAnswersAreRelayedAsTheyAre(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, body string
	}{
		{"bad JSON events", "text/event-stream", "data: {not json\n\ndata: {\"choices\":[{\"delta\":\n\n: comment\n\ndata: [DONE]\n\n"},
		{"stray SSE fields", "text/event-stream", "id: 1\nretry: x\nevent: ping\ndata: {}\n\n\r\n\r\ndata: [DONE]\n\n"},
		{"bad JSON answer", "application/json", `{"choices": [ {"message": `},
		{"binary answer", "application/octet-stream", "\x00\xff\xfe garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				io.WriteString(w, tc.body)
			}).URL
			r := startRouter(t, faultConfig(t, []string{u}, nil))
			for i := range 2 {
				resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), strings.Contains(tc.ctype, "event-stream")))
				got := readAll(t, resp)
				if resp.StatusCode != 200 || got != tc.body {
					t.Fatalf("status %d body %q, want the worker's bytes %q", resp.StatusCode, got, tc.body)
				}
			}
			if ws := workerState(t, r.srv, "w1"); ws.Health != snapshot.HealthOK || ws.Active != 0 {
				t.Fatalf("worker after malformed answers: %+v", ws)
			}
		})
	}
}

// A stream the worker ends cleanly (a proper last chunk) without [DONE]
// is relayed as it is: Sluice cannot tell it from a deliberate end, and
// the client sees that no [DONE] came. A cut connection is different
// (TestFault_WorkerCrashesMidStream).
// TestFault_StreamEndingBeforeItsTerminatorIsAnError: a worker that
// closes its stream cleanly but before its terminator ([DONE], a chunk
// with a finish_reason, llama.cpp's "stop": true) has not given the whole
// answer. The client gets what it sent, then Sluice's upstream_failed
// error event; the request counts as upstream_failed and the slot is
// freed. A stream that did send its terminator, in any of its forms, is
// relayed as it is and is a success.
func TestFault_StreamEndingBeforeItsTerminatorIsAnError(t *testing.T) {
	final := "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	tests := []struct {
		name   string
		events []string
		ok     bool
	}{
		{"chunks, no finish_reason nor [DONE]", []string{tok, tok}, false},
		{"cut in the middle of an event", []string{tok, "data: {\"choices\":[{\"index\":0,"}, false},
		{"llama.cpp native, never stop: true", []string{"data: {\"content\":\"a\",\"stop\":false}\n\n"}, false},
		{"headers only", nil, false},
		{"[DONE]", []string{tok, "data: [DONE]\n\n"}, true},
		{"final chunk without [DONE]", []string{tok, final}, true},
		{"llama.cpp native stop without [DONE]", []string{"data: {\"content\":\"a\",\"stop\":false}\n\n", "data: {\"content\":\"\",\"stop\":true}\n\n"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The handler returns: the worker ends its answer cleanly.
			u := badWorker(t, func(w http.ResponseWriter, r *http.Request) { sse(w, tt.events...) }).URL
			r := startRouter(t, faultConfig(t, []string{u}, nil))
			resp := post(t, context.Background(), r.url, chat("x", true))
			body := readAll(t, resp)
			sent := strings.Join(tt.events, "")
			if tt.name == "cut in the middle of an event" {
				// The client never gets half an event: a stream that may be
				// continued elsewhere is relayed whole events at a time.
				sent = tok
			}
			if resp.StatusCode != 200 || !strings.HasPrefix(body, sent) {
				t.Fatalf("status %d body %q: want 200 and the worker's bytes first", resp.StatusCode, body)
			}
			failed := strings.Contains(body[len(sent):], `"code":"upstream_failed"`)
			if tt.ok && body != sent {
				t.Fatalf("body %q, want exactly the worker's %q", body, sent)
			}
			if !tt.ok && !failed {
				t.Fatalf("body %q: want Sluice's upstream_failed error event after the worker's bytes", body)
			}
			reasons := map[string]float64{}
			for _, m := range scrapeFamilies(t, r.url)["sluice_requests_total"].GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" {
						reasons[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
			want := map[string]float64{"": 1}
			if !tt.ok {
				want = map[string]float64{"upstream_failed": 1}
			}
			if diff := cmp.Diff(want, reasons); diff != "" {
				t.Fatalf("sluice_requests_total by reason (-want +got):\n%s", diff)
			}
			if ws := workerState(t, r.srv, "w1"); ws.Active != 0 {
				t.Fatalf("slot not freed: %d active", ws.Active)
			}
		})
	}
}

func TestFault_SlowWorkerIsFollowedToTheEnd(t *testing.T) {
	u := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 5 {
			io.WriteString(w, tok)
			w.(http.Flusher).Flush()
			time.Sleep(40 * time.Millisecond) // the worker is slow; nothing waits on this
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}).URL
	r := startRouter(t, faultConfig(t, []string{u}, nil))
	resp := post(t, context.Background(), r.url, chat("slow", true))
	body := readAll(t, resp)
	if resp.StatusCode != 200 || strings.Count(body, tok) != 5 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if st := r.srv.tracker.Get("w1"); st.E2EMs.Value < 150 {
		t.Fatalf("end-to-end average %v ms, want the slowness (>= 150 ms) measured", st.E2EMs.Value)
	}
}

func TestFault_FlappingWorkerIsEjectedAndReadmitted(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	flap := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, `{"error":{"message":"CUDA error"}}`, http.StatusInternalServerError)
			return
		}
		sse(w, tok, "data: [DONE]\n\n")
	}).URL
	good := badWorker(t, func(w http.ResponseWriter, r *http.Request) { sse(w, tok, "data: [DONE]\n\n") }).URL
	r := startRouter(t, faultConfig(t, []string{flap, good}, func(c *config.Config) {
		c.Policy = "round-robin"
		c.Telemetry.FailThreshold = 2
	}))
	for i := 0; workerState(t, r.srv, "w1").Health != snapshot.HealthDown; i++ {
		if i == 20 {
			t.Fatal("the failing worker was not ejected after 20 requests")
		}
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), true))
		if body := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Worker") != "w2" {
			t.Fatalf("request %d: %d from %q: %q (every client answer must come from the good worker)", i, resp.StatusCode, resp.Header.Get("X-Sluice-Worker"), body)
		}
	}
	// Ejected: requests go to w2 without trying w1.
	for i := range 3 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint("e", i), true))
		readAll(t, resp)
		if resp.Header.Get("X-Sluice-Attempt") != "" || resp.Header.Get("X-Sluice-Worker") != "w2" {
			t.Fatalf("an ejected worker was tried: attempt %q worker %q", resp.Header.Get("X-Sluice-Attempt"), resp.Header.Get("X-Sluice-Worker"))
		}
	}
	// Recovered: probes pass and re-admit it (after the rise threshold).
	failing.Store(false)
	for range 2 {
		r.srv.ScrapeNow(context.Background())
	}
	if h := workerState(t, r.srv, "w1").Health; h != snapshot.HealthOK {
		t.Fatalf("after two passing probes w1 is %v, want ok", h)
	}
	r.srv.Scheduler().SetDraining("w2", true)
	resp := post(t, context.Background(), r.url, chat("back", true))
	if body := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Worker") != "w1" {
		t.Fatalf("re-admitted worker: %d from %q: %q", resp.StatusCode, resp.Header.Get("X-Sluice-Worker"), body)
	}
}

func TestFault_GarbageMetricsLeaveTheWorkerRoutable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(200)
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_waiting{model_name=\"m\"} banana\n\x00\x01 # TYPE\n{{{{\n")
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			io.Copy(io.Discard, r.Body)
			sse(w, tok, "data: [DONE]\n\n")
		}
	}))
	t.Cleanup(srv.Close)
	r := startRouter(t, testConfig(t, nil, func(c *config.Config) {
		c.Workers = []config.Worker{{Name: "w1", URL: srv.URL, Kind: "vllm", Models: []string{"m"}, MaxConcurrency: 1}}
	}))
	r.srv.ScrapeNow(context.Background())
	fs := r.srv.fleet.Get("w1").State()
	if fs.MetricsError == "" || fs.QueueLen.Known() {
		t.Fatalf("garbage metrics were believed: error %q, queue reading %+v", fs.MetricsError, fs.QueueLen)
	}
	if fs.Health != snapshot.HealthOK {
		t.Fatalf("garbage metrics made the worker %v, want ok (telemetry is not health)", fs.Health)
	}
	resp := post(t, context.Background(), r.url, chat("m", true))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("request to a worker with garbage metrics: %d %q", resp.StatusCode, body)
	}
}

// TestFault_ClientClosingAtDoneIsASuccess: many clients close the body as
// soon as they read [DONE], without reading to EOF. The worker here holds
// its connection open after [DONE] (as a worker whose final bytes are
// still on their way does), so the client's close always comes first. The
// stream was delivered whole: it counts as 200 and teaches the averages.
// A client that leaves before the end is still 499 client_gone.
func TestFault_ClientClosingAtDoneIsASuccess(t *testing.T) {
	const final = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	for _, tc := range []struct {
		name       string
		events     []string
		closeAfter string // the client closes after the line that starts so
		status     string
	}{
		{"closes at [DONE]", []string{tok, tok, tok, final, "data: [DONE]\n\n"}, "data: [DONE]", "200"},
		{"closes at the final chunk", []string{tok, tok, tok, final, "data: [DONE]\n\n"}, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\"", "200"},
		{"leaves mid-stream", []string{tok, tok, tok}, tok[:20], "499"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := badWorker(t, func(w http.ResponseWriter, r *http.Request) {
				sse(w, tc.events...)
				<-r.Context().Done() // the end of the body never comes
			}).URL
			r := startRouter(t, faultConfig(t, []string{u}, nil))
			served := make(chan struct{}, 1)
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				r.srv.Handler().ServeHTTP(w, req)
				if req.URL.Path == "/v1/chat/completions" {
					served <- struct{}{}
				}
			}))
			defer hs.Close()

			resp := post(t, context.Background(), hs.URL, chat("x", true))
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended before %q: %v", tc.closeAfter, err)
				}
				if strings.HasPrefix(line, tc.closeAfter) {
					break
				}
			}
			resp.Body.Close() // without reading to EOF
			<-served

			fams := scrapeFamilies(t, hs.URL)
			got := map[string]float64{}
			for _, m := range fams["sluice_requests_total"].GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "status" {
						got[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
			if diff := cmp.Diff(map[string]float64{tc.status: 1}, got); diff != "" {
				t.Fatalf("sluice_requests_total by status (-want +got):\n%s", diff)
			}
			st := r.srv.tracker.Get("w1")
			learned := st.TTFTMs.N == 1 && st.DecodeTPS.N == 1 && st.Levels.At(1).DecodeTPS.N == 1
			if want := tc.status == "200"; learned != want {
				t.Fatalf("learned from the stream: %v, want %v (ttft n=%d, decode n=%d, levels %d)", learned, want, st.TTFTMs.N, st.DecodeTPS.N, st.Levels.Len())
			}
			if ws := workerState(t, r.srv, "w1"); ws.Active != 0 || ws.Health == snapshot.HealthDown {
				t.Fatalf("worker after the client left: %+v", ws)
			}
		})
	}
}

// connRequests is the ConnContext key of a connection's request count.
type connRequests struct{}

// closingWorker is an OpenAI-compatible worker on loopback that closes
// idle keep-alive connections: a request arriving on a connection that
// has already served one is met by the close, without an answer, as a
// request is that llama-server's keep-alive timer beats by a hair. A
// connection's first request is answered. It counts the requests it
// dropped.
func closingWorker(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var dropped atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connRequests{}).(*atomic.Int32).Add(1)
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		if n > 1 {
			dropped.Add(1)
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			c.Close() // closed as idle: the request gets no byte back
			return
		}
		sse(w, tok, "data: [DONE]\n\n")
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int32))
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &dropped
}

// TestFault_StaleKeepAliveIsResentOnAFreshConnection: a request sent on a
// pooled connection the worker has just closed fails with EOF before any
// byte. It is resent once to the same worker on a connection of its own;
// the client never sees the failure, no other worker is tried, and the
// worker's health is not touched.
func TestFault_StaleKeepAliveIsResentOnAFreshConnection(t *testing.T) {
	srv, dropped := closingWorker(t)
	r := startRouter(t, faultConfig(t, []string{srv.URL}, func(c *config.Config) {
		c.Telemetry.FailThreshold = 1 // one counted failure would eject it
	}))
	for i := range 4 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), true))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	// Of four requests in a row at least every other one finds the
	// connection its predecessor left in the pool.
	if dropped.Load() < 2 {
		t.Fatalf("the worker dropped %d requests on reused connections, want at least 2", dropped.Load())
	}
	fams := scrapeFamilies(t, r.url)
	var stale float64
	for _, m := range fams["sluice_stale_connection_retries_total"].GetMetric() {
		stale += m.GetCounter().GetValue()
	}
	if got, want := stale, float64(dropped.Load()); got != want {
		t.Errorf("sluice_stale_connection_retries_total %v, want %v (one per dropped request)", got, want)
	}
	if f := fams["sluice_retries_total"]; f != nil {
		t.Errorf("sluice_retries_total present: %v; a resend to the same worker is no retry elsewhere", f.GetMetric())
	}
	if fs := r.srv.fleet.Get("w1").State(); fs.ConsecutiveFailures != 0 || fs.Health != snapshot.HealthOK {
		t.Errorf("worker health after stale connections: %v with %d failures (%s)", fs.Health, fs.ConsecutiveFailures, fs.Reason)
	}
}

// A fresh connection that fails too is the worker's fault, as before.
// Every connection to the worker is closed unanswered, the probe's too:
// a probe that passed would reset the count of consecutive failures.
func TestFault_FreshConnectionFailureStillCounts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close() // every request, every connection
	}))
	t.Cleanup(srv.Close)
	r := startRouter(t, faultConfig(t, []string{srv.URL}, func(c *config.Config) { c.Telemetry.FailThreshold = 100 }))
	for i := range 3 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), true))
		if readAll(t, resp); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i, resp.StatusCode)
		}
	}
	if fs := r.srv.fleet.Get("w1").State(); fs.ConsecutiveFailures < 3 {
		t.Errorf("worker has %d failures counted, want one per request at least", fs.ConsecutiveFailures)
	}
}
