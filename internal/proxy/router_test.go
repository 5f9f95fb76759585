package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// testRouter is a Handler with a real scheduler in front of workers on
// loopback, served over real HTTP.
type testRouter struct {
	t     *testing.T
	sched *scheduler.Scheduler
	h     *Handler
	srv   *httptest.Server
	rep   *countReporter
	logs  *syncBuffer
}

// testWorker is a worker's name and base URL.
type testWorker struct{ name, url string }

// newTestRouter starts a router over workers, which serve model "m" as
// llama.cpp does (so a stream may be continued on any of them), each up
// to 4 requests at once. opt's Scheduler, Resolve, Reporter and Logger are
// the router's; wrap, when not nil, wraps the Handler as served.
func newTestRouter(t *testing.T, cfg scheduler.Config, opt Options, wrap func(http.Handler) http.Handler, ws ...testWorker) *testRouter {
	t.Helper()
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = time.Minute
	}
	cfg.IDPrefix, cfg.MaxQueue, cfg.Limits.Fixed = "d", 8, true
	urls := map[string]*url.URL{}
	var specs []scheduler.WorkerSpec
	for _, w := range ws {
		u, err := url.Parse(w.url)
		if err != nil {
			t.Fatal(err)
		}
		urls[w.name] = u
		specs = append(specs, scheduler.WorkerSpec{Name: w.name, Models: []string{"m"}, MaxConcurrency: 4, Kind: kindLlamaCPP})
	}
	s, err := scheduler.New(cfg, specs...)
	if err != nil {
		t.Fatal(err)
	}
	r := &testRouter{t: t, sched: s, rep: &countReporter{}, logs: &syncBuffer{}}
	opt.Scheduler, opt.Reporter = s, r.rep
	opt.Resolve = func(name string) (*url.URL, bool) { u, ok := urls[name]; return u, ok }
	opt.Logger = slog.New(slog.NewTextHandler(r.logs, nil))
	r.h = New(opt)
	var served http.Handler = r.h
	if wrap != nil {
		served = wrap(r.h)
	}
	r.srv = httptest.NewUnstartedServer(served)
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics the tests provoke
	r.srv.Start()
	t.Cleanup(func() {
		if !t.Failed() { // a router that hangs could not be closed
			r.srv.Close()
		}
	})
	return r
}

// post sends body to path and returns the status, the answer read to its
// end (or to the error that ended it) and its headers.
func (r *testRouter) post(path, body string) (int, string, http.Header) {
	r.t.Helper()
	resp, err := r.srv.Client().Post(r.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// inFlight is the router's requests in flight, by worker, where not 0.
func (r *testRouter) inFlight() map[string]int {
	out := map[string]int{}
	for _, w := range r.sched.Workers() {
		if w.Active != 0 {
			out[w.Name] = w.Active
		}
	}
	return out
}

// countReporter counts the outcomes of attempts reported for health.
type countReporter struct {
	mu    sync.Mutex
	fails map[string][]string
	oks   map[string]int
}

func (c *countReporter) ReportRequest(worker string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fails == nil {
		c.fails, c.oks = map[string][]string{}, map[string]int{}
	}
	if err != nil {
		c.fails[worker] = append(c.fails[worker], err.Error())
		return
	}
	c.oks[worker]++
}

// failures is the failures reported against worker, as their errors say.
func (c *countReporter) failures(worker string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fails[worker]
}

// syncBuffer is a bytes.Buffer the handler goroutines may log into.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// chatEvent is one streamed chat chunk carrying text.
func chatEvent(text string) string {
	return fmt.Sprintf("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", text)
}

// streamWorker streams n chat chunks, word0 to word<n-1>, and its end.
func streamWorker(word string, n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			io.WriteString(w, chatEvent(fmt.Sprint(" ", word, i)))
		}
		io.WriteString(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}
}

// breakingWorker streams n chat chunks, then cuts its connection.
func breakingWorker(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			io.WriteString(w, chatEvent(fmt.Sprint(" t", i)))
		}
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
}

// failingWorker answers every request with status and body.
func failingWorker(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, body, status)
	}
}

// resettingWorker streams n chat chunks, then, once reset is closed,
// resets its connection (a TCP RST): the router's read of the answer
// fails with an error naming both ends' addresses.
func resettingWorker(t *testing.T, n int, reset <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		var events strings.Builder
		for i := range n {
			events.WriteString(chatEvent(fmt.Sprint(" t", i)))
		}
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", events.Len(), events.String())
		buf.Flush()
		<-reset
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
}

// startWorker serves h on loopback until the test ends.
func startWorker(t *testing.T, name string, h http.Handler) testWorker {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return testWorker{name, srv.URL}
}

const chatStreamBody = `{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`
