package fleet

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
)

// newClock is a settable Options.Now.
func newClock() *clocktest.ManualClock {
	return clocktest.NewManualClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
}

// fakeServer plays a worker: each path answers what its fields say.
// Mode "up" answers; "down" aborts every connection (a crashed server);
// "hang" blocks until the request's context ends or release is closed.
type fakeServer struct {
	mu      sync.Mutex
	mode    string
	routes  map[string]route
	hits    map[string]int
	entered chan string // receives the path of every hanging request
	release chan struct{}
}

type route struct {
	status int
	body   string
}

func newFakeServer() *fakeServer {
	return &fakeServer{
		mode:    "up",
		routes:  map[string]route{},
		hits:    map[string]int{},
		entered: make(chan string, 100),
		release: make(chan struct{}),
	}
}

func (s *fakeServer) set(path string, status int, body string) {
	s.mu.Lock()
	s.routes[path] = route{status, body}
	s.mu.Unlock()
}

func (s *fakeServer) setMode(mode string) {
	s.mu.Lock()
	s.mode = mode
	s.mu.Unlock()
}

func (s *fakeServer) hitCount(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

func (s *fakeServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.hits[r.URL.Path]++
	mode := s.mode
	rt, ok := s.routes[r.URL.Path]
	s.mu.Unlock()
	switch mode {
	case "down":
		panic(http.ErrAbortHandler)
	case "hang":
		s.entered <- r.URL.Path
		select {
		case <-r.Context().Done():
		case <-s.release:
		}
		return
	}
	if !ok {
		http.NotFound(rw, r)
		return
	}
	rw.WriteHeader(rt.status)
	rw.Write([]byte(rt.body))
}

// serve starts an httptest server for s; hanging handlers are released
// before the server closes.
func serve(t *testing.T, s *fakeServer) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(s.release) })
	return srv
}

// testdata reads a payload from the telemetry package's golden files, so
// the fleet is tested against the same real formats.
func testdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "telemetry", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// llamaServer is a healthy llama.cpp with 4 slots and one model.
func llamaServer(t *testing.T) *fakeServer {
	s := newFakeServer()
	s.set("/health", 200, testdata(t, "llamacpp_health_ok.json"))
	s.set("/metrics", 200, testdata(t, "llamacpp_metrics.txt"))
	s.set("/props", 200, testdata(t, "llamacpp_props.json"))
	s.set("/v1/models", 200, testdata(t, "llamacpp_models.json"))
	return s
}

// rounds counts finished probe rounds per worker and lets tests wait for
// them (the afterRound hook).
type rounds struct {
	mu      sync.Mutex
	n       map[string]int
	changed chan struct{}
}

func newRounds() *rounds { return &rounds{n: map[string]int{}, changed: make(chan struct{})} }

func (r *rounds) done(name string) {
	r.mu.Lock()
	r.n[name]++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *rounds) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[name]
}

// wait blocks until name has finished at least n rounds.
func (r *rounds) wait(t *testing.T, name string, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		got, ch := r.n[name], r.changed
		r.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("worker %s: %d rounds after 10s, want %d", name, got, n)
		}
	}
}

// changes records OnChange calls.
type changes struct {
	mu    sync.Mutex
	names []string
	ch    chan string
}

func newChanges() *changes { return &changes{ch: make(chan string, 1000)} }

func (c *changes) record(name string) {
	c.mu.Lock()
	c.names = append(c.names, name)
	c.mu.Unlock()
	select {
	case c.ch <- name:
	default:
	}
}

func (c *changes) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, have := range c.names {
		if have == name {
			n++
		}
	}
	return n
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(substr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), substr)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// harness is a Fleet whose scrapers run one round at Add and then only
// through ScrapeNow (Interval is an hour), on a fake clock.
type harness struct {
	f       *Fleet
	clock   *clocktest.ManualClock
	rounds  *rounds
	changes *changes
	logs    *logBuffer
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{clock: newClock(), rounds: newRounds(), changes: newChanges(), logs: &logBuffer{}}
	if opts.Interval == 0 {
		opts.Interval = time.Hour
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	opts.Now = h.clock.Now
	opts.afterRound = h.rounds.done
	opts.OnChange = h.changes.record
	opts.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.f = New(opts)
	t.Cleanup(h.f.Close)
	return h
}

// add adds a worker and waits for its first round.
func (h *harness) add(t *testing.T, cfg WorkerConfig) *Worker {
	t.Helper()
	w, err := h.f.Add(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.rounds.wait(t, cfg.Name, 1)
	return w
}

// scrape runs one round of the named worker.
func (h *harness) scrape(t *testing.T, name string) {
	t.Helper()
	w := h.f.Get(name)
	if w == nil {
		t.Fatalf("no worker %q", name)
	}
	w.ScrapeNow(context.Background())
}
