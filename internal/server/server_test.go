package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// fakeWorker is an OpenAI-compatible test server on loopback whose
// answers a test can hold, fail and count.
type fakeWorker struct {
	name string
	srv  *httptest.Server

	mu          sync.Mutex
	inflight    int
	maxInflight int
	served      []string // request ids ("user" field), in arrival order

	hold    chan struct{} // when not nil, each request waits for a value
	arrived chan string   // when not nil, receives each request's id on arrival
	fail    atomic.Int32  // this many next requests answer 500
	midFail atomic.Bool   // streams break after the first chunk
	tokens  int
}

func newFakeWorker(t *testing.T, name string) *fakeWorker {
	f := &fakeWorker{name: name, tokens: 5}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeWorker) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		return
	case "/v1/chat/completions", "/v1/completions", "/completion":
	default:
		http.NotFound(w, r)
		return
	}
	var body struct {
		User   string `json:"user"`
		Stream bool   `json:"stream"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	if f.fail.Load() > 0 {
		f.fail.Add(-1)
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		return
	}
	f.mu.Lock()
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	f.served = append(f.served, body.User)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if f.arrived != nil {
		f.arrived <- body.User
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-r.Context().Done():
			return
		}
	}
	if !body.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}`, f.tokens, f.tokens+3)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range f.tokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		w.(http.Flusher).Flush()
		if f.midFail.Load() && i == 0 {
			panic(http.ErrAbortHandler) // break the connection mid-stream
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func (f *fakeWorker) stats() (max int, served []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInflight, slices.Clone(f.served)
}

type router struct {
	srv *Server
	url string
	hs  *httptest.Server
}

func testConfig(t *testing.T, workers []*fakeWorker, edit func(*config.Config)) config.Config {
	cfg := config.DefaultConfig()
	for _, w := range workers {
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.name, URL: w.srv.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1})
	}
	cfg.Stats.Store = filepath.Join(t.TempDir(), "stats.db")
	cfg.Telemetry.Interval = time.Hour // probes are not under test here
	cfg.Telemetry.StaleAfter = time.Hour
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startRouter(t *testing.T, cfg config.Config) *router {
	t.Helper()
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	r := &router{srv: srv, url: hs.URL, hs: hs}
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *router) stop(t *testing.T) {
	if r.hs == nil {
		return
	}
	r.hs.Close()
	if err := r.srv.Close(); err != nil {
		t.Error(err)
	}
	r.hs = nil
}

func chat(id string, stream bool) string {
	return fmt.Sprintf(`{"model":"m","user":%q,"stream":%v,"messages":[{"role":"user","content":"hello there"}],"max_tokens":16}`, id, stream)
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRouter_BurstAtIdleWorkersLandsOnePerWorker(t *testing.T) {
	var ws []*fakeWorker
	for i := range 4 {
		ws = append(ws, newFakeWorker(t, fmt.Sprintf("gpu%d", i)))
	}
	r := startRouter(t, testConfig(t, ws, nil))
	for round := range 25 {
		for _, w := range ws {
			w.hold = make(chan struct{})
			w.arrived = make(chan string, 4)
		}
		var wg sync.WaitGroup
		got := make([]string, 4)
		start := make(chan struct{})
		for i := range 4 {
			wg.Go(func() {
				<-start
				resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), false))
				got[i] = resp.Header.Get("X-Sluice-Worker")
				readAll(t, resp)
			})
		}
		close(start)
		for _, w := range ws { // every worker receives exactly one...
			<-w.arrived
		}
		for _, w := range ws { // ...then all are answered
			close(w.hold)
		}
		wg.Wait()
		slices.Sort(got)
		if want := []string{"gpu0", "gpu1", "gpu2", "gpu3"}; !slices.Equal(got, want) {
			t.Fatalf("round %d: served by %v, want one per worker", round, got)
		}
	}
}

func TestRouter_QueueWithLimitOneIsOldestFirst(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 10)
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, nil))
	const n = 6
	var wg sync.WaitGroup
	statuses := make([]int, n)
	// Submit one at a time, each after the previous is admitted or queued,
	// so arrival order is known.
	for i := range n {
		wg.Go(func() {
			resp := post(t, context.Background(), r.url, chat(strconv.Itoa(i), true))
			statuses[i] = resp.StatusCode
			readAll(t, resp)
		})
		if i == 0 {
			<-w.arrived
		} else {
			waitFor(t, r, func() bool { return r.srv.Scheduler().QueueDepth("m") == i })
		}
	}
	for range n {
		w.hold <- struct{}{}
		if _, served := w.stats(); len(served) < n {
			<-w.arrived
		}
	}
	wg.Wait()
	maxIn, served := w.stats()
	if maxIn != 1 {
		t.Fatalf("worker saw %d requests at once; limit is 1", maxIn)
	}
	if want := []string{"0", "1", "2", "3", "4", "5"}; !slices.Equal(served, want) {
		t.Fatalf("served in order %v, want %v", served, want)
	}
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("request %d: status %d", i, s)
		}
	}
}

// waitFor waits until cond holds, re-checking at every change of the
// scheduler's admission state, for at most 10 seconds.
func waitFor(t *testing.T, r *router, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		changed := r.srv.Scheduler().Changed() // before the check: no missed wake-up
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatal("condition not reached in 10s")
		}
	}
}

func TestRouter_QueueFullAndTimeout(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 10)
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
		c.Admission.MaxQueue = 1
		c.Admission.QueueTimeout = 200 * time.Millisecond
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		readAll(t, post(t, context.Background(), r.url, chat("held", false)))
	}()
	<-w.arrived

	queued := make(chan *http.Response)
	go func() { queued <- post(t, context.Background(), r.url, chat("queued", false)) }()
	waitFor(t, r, func() bool { return r.srv.Scheduler().QueueDepth("m") == 1 })

	full := post(t, context.Background(), r.url, chat("full", false))
	body := readAll(t, full)
	checkRefusal(t, full, body, http.StatusTooManyRequests, "queue_full")

	timedOut := <-queued
	body = readAll(t, timedOut)
	checkRefusal(t, timedOut, body, http.StatusServiceUnavailable, "queue_timeout")
	close(w.hold)
	<-done
}

func checkRefusal(t *testing.T, resp *http.Response, body string, status int, reason string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if got := resp.Header.Get("X-Sluice-Reason"); got != reason {
		t.Errorf("X-Sluice-Reason %q, want %q", got, reason)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", resp.Header.Get("Retry-After"))
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != reason || e.Error.Message == "" {
		t.Errorf("body %s: want OpenAI error with code %q", body, reason)
	}
}

func TestRouter_ClientDisconnectWhileQueuedAndMidStream(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 10)
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, nil))

	// A stream holds the only slot.
	ctx1, cancel1 := context.WithCancel(context.Background())
	streaming := make(chan *http.Response)
	go func() { streaming <- post(t, ctx1, r.url, chat("stream", true)) }()
	<-w.arrived

	// A second request queues, then its client leaves.
	ctx2, cancel2 := context.WithCancel(context.Background())
	gone := make(chan error)
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chat("leaver", false)))
		_, err := http.DefaultClient.Do(req)
		gone <- err
	}()
	waitFor(t, r, func() bool { return r.srv.Scheduler().QueueDepth("m") == 1 })
	cancel2()
	<-gone
	waitFor(t, r, func() bool { return r.srv.Scheduler().QueueDepth("m") == 0 })
	if got := r.srv.Scheduler().Workers()[0].Active; got != 1 {
		t.Fatalf("active %d after a queued client left; the stream still holds its slot", got)
	}

	// The streaming client leaves mid-answer: the slot frees.
	w.hold <- struct{}{}
	resp := <-streaming
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first stream line %q, %v", line, err)
	}
	cancel1()
	resp.Body.Close()
	waitFor(t, r, func() bool { return r.srv.Scheduler().Workers()[0].Active == 0 })

	// And the worker serves the next request.
	close(w.hold)
	if resp := post(t, context.Background(), r.url, chat("next", false)); resp.StatusCode != 200 {
		t.Fatalf("next request: %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	if _, served := w.stats(); slices.Contains(served, "leaver") {
		t.Fatal("the request whose client left while queued reached the worker")
	}
}

func TestRouter_RetryBeforeFirstByte(t *testing.T) {
	bad, good := newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")
	bad.fail.Store(1)
	r := startRouter(t, testConfig(t, []*fakeWorker{bad, good}, nil))
	resp := post(t, context.Background(), r.url, chat("x", true))
	body := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Worker") != "gpu1" {
		t.Fatalf("status %d worker %q; want 200 from gpu1 after gpu0 failed", resp.StatusCode, resp.Header.Get("X-Sluice-Worker"))
	}
	if !strings.Contains(body, "[DONE]") || resp.Header.Get("X-Sluice-Attempt") != "2" {
		t.Fatalf("attempt %q body %q", resp.Header.Get("X-Sluice-Attempt"), body)
	}

	// Every worker failing: 502 with the cause.
	bad.fail.Store(1)
	good.fail.Store(1)
	resp = post(t, context.Background(), r.url, chat("y", false))
	body = readAll(t, resp)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "upstream_failed") {
		t.Fatalf("status %d body %s; want 502 upstream_failed", resp.StatusCode, body)
	}
}

func TestRouter_MidStreamFailureEndsWithErrorEvent(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	w.midFail.Store(true)
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, nil))
	resp := post(t, context.Background(), r.url, chat("x", true))
	body := readAll(t, resp)
	if !strings.Contains(body, `"code":"upstream_failed"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("body %q: want the first chunk then an error event", body)
	}
}

func TestRouter_DecisionRecordMatchesHeaders(t *testing.T) {
	ws := []*fakeWorker{newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")}
	r := startRouter(t, testConfig(t, ws, nil))
	resp := post(t, context.Background(), r.url, chat("x", true))
	readAll(t, resp)
	id := resp.Header.Get("X-Sluice-Decision")
	g, err := http.Get(r.url + "/debug/decisions/" + id)
	if err != nil {
		t.Fatal(err)
	}
	var rec decisions.Record
	if err := json.Unmarshal([]byte(readAll(t, g)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID != id || rec.Chosen != resp.Header.Get("X-Sluice-Worker") || rec.Outcome != "bound" {
		t.Fatalf("record %s chose %s (%s); headers say %s on %s", rec.ID, rec.Chosen, rec.Outcome, id, resp.Header.Get("X-Sluice-Worker"))
	}
	if q, _ := strconv.ParseFloat(resp.Header.Get("X-Sluice-Queue-Ms"), 64); q != float64(int64(rec.QueueWaitMs)) {
		t.Errorf("X-Sluice-Queue-Ms %v, record %v", q, rec.QueueWaitMs)
	}
	if nt := len(scheduler.DefaultTerms(scheduler.DefaultWeights())); len(rec.Candidates) != 2 || len(rec.Candidates[0].Terms) != nt {
		t.Fatalf("record has %d candidates, first with %d terms; want 2 and %d", len(rec.Candidates), len(rec.Candidates[0].Terms), nt)
	}
	list, _ := http.Get(r.url + "/debug/decisions?limit=1")
	var l struct{ Decisions []decisions.Record }
	json.Unmarshal([]byte(readAll(t, list)), &l)
	if len(l.Decisions) != 1 || l.Decisions[0].ID != id {
		t.Fatalf("recent decisions %+v, want just %s", l.Decisions, id)
	}
}

func TestRouter_EMAsSurviveRestart(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	cfg := testConfig(t, []*fakeWorker{w}, nil)
	r := startRouter(t, cfg)
	for i := range 3 {
		readAll(t, post(t, context.Background(), r.url, chat(strconv.Itoa(i), true)))
	}
	before := r.srv.tracker.Get("gpu0")
	if before.TTFTMs.N != 3 || before.OutputTokens.Value != 5 {
		t.Fatalf("stats before restart %+v: want 3 TTFT samples and 5 output tokens", before)
	}
	r.stop(t)

	r2 := startRouter(t, cfg)
	after := r2.srv.tracker.Get("gpu0")
	if after.TTFTMs != before.TTFTMs || after.DecodeTPS != before.DecodeTPS || after.OutputTokens != before.OutputTokens {
		t.Fatalf("after restart %+v, before %+v", after, before)
	}
}

func TestRouter_BadRequests(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, func(c *config.Config) { c.Proxy.MaxBodyBytes = 1024 }))
	tests := []struct {
		name, path, body string
		status           int
		code             string
		msg              string // a part of the message, when it must name something
	}{
		{"malformed json", "/v1/chat/completions", `{"model":`, 400, "invalid_request", ""},
		{"missing model", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request", ""},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found", `model "nope"`},
		{"too large", "/v1/chat/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "body_too_large", ""},
		{"negative max_tokens", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":-5}`, 400, "invalid_request", ""},
		{"no such route", "/v2/things", `{}`, 404, "not_found", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(r.url+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tt.status, body)
			}
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("body %s: want OpenAI error with code %q", body, tt.code)
			}
			if !strings.Contains(e.Error.Message, tt.msg) {
				t.Fatalf("message %q does not name %s", e.Error.Message, tt.msg)
			}
		})
	}
	if _, served := w.stats(); len(served) != 0 {
		t.Fatalf("bad requests reached the worker: %v", served)
	}
}

func TestRouter_ModelsMetricsAndHealth(t *testing.T) {
	r := startRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "gpu0")}, nil))
	readAll(t, post(t, context.Background(), r.url, chat("x", true)))
	for path, want := range map[string]string{
		"/v1/models":   `"id": "m"`,
		"/healthz":     "ok",
		"/readyz":      "ready",
		"/api/workers": `"name": "gpu0"`,
		"/metrics":     `sluice_requests_total{model="m",reason="",status="200",worker="gpu0"} 1`,
	} {
		resp, err := http.Get(r.url + path)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, body lacks %q:\n%s", path, resp.StatusCode, want, body)
		}
	}
}

var discard = slog.New(slog.DiscardHandler)

func newLoopbackServer(h http.Handler) *httptest.Server { return httptest.NewServer(h) }
