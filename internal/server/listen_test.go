package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// served is a router serving on a real loopback listener through Serve.
type served struct {
	srv  *Server
	url  string
	addr string

	cancel   context.CancelFunc
	errc     chan error
	stopOnce sync.Once
	err      error
}

func serveRouter(t *testing.T, cfg config.Config, prepare func(*Server)) *served {
	t.Helper()
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{srv: srv, addr: ln.Addr().String(), cancel: cancel, errc: make(chan error, 1)}
	s.url = "http://" + s.addr
	if cfg.TLS.CertFile != "" {
		s.url = "https://" + s.addr
	}
	go func() { s.errc <- srv.Serve(ctx, ln, 0) }()
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
		srv.Close()
	})
	return s
}

// stop ends Serve and returns its error; later calls return the same.
func (s *served) stop() error {
	s.stopOnce.Do(func() {
		s.cancel()
		s.err = <-s.errc
	})
	return s.err
}

func quickShutdown(c *config.Config) { c.Shutdown.DrainDelay = 0; c.Shutdown.Grace = 5 * time.Second }

// dialRaw opens a raw connection with a safety deadline: a test that
// fails by hanging fails in 10 s instead.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether reading c ends because the server closed
// it (EOF or reset), not because the safety deadline passed.
func closedByServer(t *testing.T, c net.Conn, r io.Reader) {
	t.Helper()
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept the connection open")
	}
}

func TestServe_MaxHeaderBytesAnswers431(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.MaxHeaderBytes = 1024
	}), nil)
	req, _ := http.NewRequest("GET", s.url+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 16<<10)) // net/http allows 4 KiB of slack
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	if resp, err := http.Get(s.url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a normal request after it: %v %v", resp, err)
	}
}

func TestServe_ReadHeaderTimeoutClosesSlowClients(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.ReadHeaderTimeout = 100 * time.Millisecond
	}), nil)
	c := dialRaw(t, s.addr)
	// Half a header block, then silence: a slowloris client.
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: sluice\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, c, c)
}

func TestServe_IdleTimeoutClosesKeepAliveConnections(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.IdleTimeout = 100 * time.Millisecond
	}), nil)
	c := dialRaw(t, s.addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	closedByServer(t, c, br)
}

func TestServe_MaxConnectionsMakesExtraConnectionsWait(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.MaxConnections = 1
	}), nil)
	oneConnectionAtATime(t, s)
}

// With server.max_connections left at 0, the cap is half of the open
// files the router's reserve leaves: here one connection.
func TestServe_ConnectionsAreCappedByTheOpenFileLimit(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, quickShutdown), func(srv *Server) {
		srv.openFiles = func() (uint64, error) { return fileReserve + 2, nil }
	})
	oneConnectionAtATime(t, s)
}

// oneConnectionAtATime checks that s serves one connection at a time: a
// second waits, unaccepted, until the first closes.
func oneConnectionAtATime(t *testing.T, s *served) {
	t.Helper()
	get := func(c net.Conn, br *bufio.Reader) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	a := dialRaw(t, s.addr)
	abr := bufio.NewReader(a)
	if err := get(a, abr); err != nil {
		t.Fatal(err)
	}
	b := dialRaw(t, s.addr) // the kernel completes the handshake; Sluice does not accept it
	bDone := make(chan error, 1)
	go func() { bDone <- get(b, bufio.NewReader(b)) }()
	// The first connection still works, and meanwhile the second waits.
	for range 3 {
		if err := get(a, abr); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-bDone:
		t.Fatalf("second connection served while the first held the only slot (err %v)", err)
	default:
	}
	a.Close()
	if err := <-bDone; err != nil {
		t.Fatalf("second connection after the first closed: %v", err)
	}
}

// phase is one timed wait of the shutdown sequence, released by the test.
type phase struct {
	d       time.Duration
	release chan time.Time
}

func TestServe_ShutdownDrainsFinishesInFlightAndRefusesStillQueued(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 4)
	cfg := testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
		c.Shutdown.DrainDelay = 5 * time.Second
		c.Shutdown.Grace = 30 * time.Second
		c.Admission.QueueTimeout = time.Hour
	})
	phases := make(chan phase)
	s := serveRouter(t, cfg, func(srv *Server) {
		srv.after = func(d time.Duration) <-chan time.Time {
			p := phase{d: d, release: make(chan time.Time)}
			phases <- p
			return p.release
		}
	})
	type result struct {
		status int
		reason string
		body   string
		err    error
	}
	send := func(id string) chan result {
		ch := make(chan result, 1)
		go func() {
			req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions", strings.NewReader(chat(id, true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			ch <- result{status: resp.StatusCode, reason: resp.Header.Get("X-Sluice-Reason"), body: string(b), err: err}
		}()
		return ch
	}
	r := &router{srv: s.srv}
	a := send("A")
	if got := <-w.arrived; got != "A" {
		t.Fatalf("arrived %q, want A", got)
	}
	b := send("B")
	waitFor(t, r, func() bool { return s.srv.Scheduler().QueueDepth("m") == 1 })
	c := send("C")
	waitFor(t, r, func() bool { return s.srv.Scheduler().QueueDepth("m") == 2 })

	s.cancel() // what SIGTERM does
	drain := <-phases
	if drain.d != 5*time.Second {
		t.Fatalf("first wait %v, want the drain delay 5s", drain.d)
	}
	resp, err := http.Get(s.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	checkError(t, resp, body, http.StatusServiceUnavailable, "shutting_down")
	if resp, err := http.Get(s.url + "/v1/models"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("during the drain delay the router must still serve: %v %v", resp, err)
	}
	close(drain.release)
	grace := <-phases
	if grace.d != 30*time.Second {
		t.Fatalf("second wait %v, want the grace 30s", grace.d)
	}
	// Within the grace period the request in flight finishes and the
	// oldest queued one is placed.
	w.hold <- struct{}{}
	if res := <-a; res.err != nil || res.status != 200 || !strings.Contains(res.body, "[DONE]") {
		t.Fatalf("in-flight request across shutdown: %+v", res)
	}
	if got := <-w.arrived; got != "B" {
		t.Fatalf("arrived %q, want B", got)
	}
	close(grace.release) // the deadline: C is still queued
	res := <-c
	if res.err != nil || res.status != http.StatusServiceUnavailable || res.reason != "shutting_down" {
		t.Fatalf("request queued at the deadline: %+v, want 503 shutting_down", res)
	}
	window := <-phases
	if window.d != refuseWindow {
		t.Fatalf("third wait %v, want the refuse window", window.d)
	}
	w.hold <- struct{}{}
	if res := <-b; res.err != nil || res.status != 200 || !strings.Contains(res.body, "[DONE]") {
		t.Fatalf("request placed during the grace period: %+v", res)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("Serve returned %v after a clean shutdown", err)
	}
	if _, served := w.stats(); len(served) != 2 {
		t.Fatalf("worker served %v, want A and B", served)
	}
}

func TestServe_ShutdownCutsWhatOutlivesTheGrace(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 1)
	phases := make(chan phase)
	s := serveRouter(t, testConfig(t, []*fakeWorker{w}, quickShutdown), func(srv *Server) {
		srv.after = func(d time.Duration) <-chan time.Time {
			p := phase{d: d, release: make(chan time.Time)}
			phases <- p
			return p.release
		}
	})
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(chat("stuck", true)))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	<-w.arrived
	s.cancel()
	close((<-phases).release) // grace
	close((<-phases).release) // refuse window
	if err := s.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-errc; err == nil {
		t.Fatal("a stream cut at the deadline read as complete")
	}
}

func TestServe_SlowBodyGets408(t *testing.T) {
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.ReadHeaderTimeout = 100 * time.Millisecond // the body's deadline is this plus 1 KiB at 1 Mbit/s
		c.Proxy.MaxBodyBytes = 1024
	}), nil)
	c := dialRaw(t, s.addr)
	// Whole headers, a tenth of the body, then silence.
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\":\"m\","); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a body that stopped coming: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkError(t, resp, string(b), http.StatusRequestTimeout, "body_timeout")
	if !strings.Contains(string(b), "proxy.max_body_bytes") {
		t.Errorf("the message does not say what the deadline is made of: %s", b)
	}
	closedByServer(t, c, br)
	if resp, err := http.Get(s.url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a normal request after it: %v %v", resp, err)
	}
}

func TestServe_StreamOutlastsTheBodyDeadline(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 1)
	const deadline = 100 * time.Millisecond
	s := serveRouter(t, testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
		quickShutdown(c)
		c.Server.ReadHeaderTimeout = deadline
		c.Proxy.MaxBodyBytes = 1024
	}), nil)
	got := make(chan string, 1)
	go func() {
		resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(chat("long", true)))
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	<-w.arrived
	// The body was read long ago; the request now runs past the deadline
	// the body had, which must not cut it.
	<-time.After(5 * deadline)
	close(w.hold)
	if g := <-got; !strings.HasPrefix(g, "200 ") || !strings.Contains(g, "[DONE]") {
		t.Fatalf("a stream longer than the body's deadline: %s", g)
	}
}

func TestMaxConnections_SizedToTheOpenFileLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		configured int
		files      uint64
		err        error
		want       int
	}{
		{"configured", 5, 1 << 20, nil, 5},
		{"a container's limit", 0, 1 << 20, nil, (1<<20 - fileReserve) / 2},
		{"a small limit", 0, 1024, nil, (1024 - fileReserve) / 2},
		{"under the reserve", 0, 100, nil, 1},
		{"unlimited", 0, ^uint64(0), nil, (1<<30 - fileReserve) / 2},
		{"unknown", 0, 0, errors.New("no limit here"), 0},
	} {
		s := &Server{cfg: config.DefaultConfig(), openFiles: func() (uint64, error) { return tc.files, tc.err }}
		s.cfg.Server.MaxConnections = tc.configured
		if got, _, _ := s.maxConnections(); got != tc.want {
			t.Errorf("%s: %d connections, want %d", tc.name, got, tc.want)
		}
	}
	// This machine's limit is known, and leaves room for connections.
	if n, files, err := (&Server{cfg: config.DefaultConfig(), openFiles: openFileLimit}).maxConnections(); err != nil || n < 1 || files <= fileReserve {
		t.Errorf("this machine: %d connections for an open-file limit of %d (%v)", n, files, err)
	}
}

// TestServe_ShutdownEndsStreamsWithAnErrorEvent runs a stream from a
// slow simulated worker (a token a second) into a shutdown whose grace
// period ends while it runs: the client reads, after the tokens it had,
// an error event saying the router is shutting down, in its API's shape,
// with no [DONE], so it can tell a shutdown from a network fault.
func TestServe_ShutdownEndsStreamsWithAnErrorEvent(t *testing.T) {
	const shutdownMessage = "the router is shutting down and ended this stream at the end of its grace period; send the request again"
	spec := sim.WorkerSpec{Name: "slow", Params: sim.DefaultParams()}
	spec.Params.DecodeBase = time.Second
	fl, err := sim.StartFleet(context.Background(), []sim.WorkerSpec{spec}, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	w := fl.Workers()[0]
	<-w.Server.Ready()
	model := spec.Params.Model
	chat := `{"model":"` + model + `","stream":true,"max_tokens":1000,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	openAIEnd := `data: {"error":{"message":"` + shutdownMessage + `","type":"server_error","param":null,"code":"shutting_down"}}`
	tests := []struct {
		name, path, body string
		noContinue       bool   // X-Sluice-Continue: off (relayed as it comes, not whole events)
		want             string // the stream's last event
	}{
		{"chat", "/v1/chat/completions", chat, false, openAIEnd},
		{"chat not continuable", "/v1/chat/completions", chat, true, openAIEnd},
		{"messages", "/v1/messages",
			`{"model":"` + model + `","stream":true,"max_tokens":1000,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, false,
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"" + shutdownMessage + "\"}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.DefaultConfig()
			cfg.Workers = []config.Worker{{Name: w.Name, URL: w.URL, Kind: "llamacpp", Models: []string{model}}}
			cfg.Stats.Store = "memory"
			cfg.Telemetry.Interval = time.Hour
			quickShutdown(&cfg)
			phases := make(chan phase)
			s := serveRouter(t, cfg, func(srv *Server) {
				srv.after = func(d time.Duration) <-chan time.Time {
					p := phase{d: d, release: make(chan time.Time)}
					phases <- p
					return p.release
				}
			})
			started := make(chan struct{})
			type result struct {
				rest string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				// The timeout is a safety bound: without the error event the
				// stream would run on for minutes.
				client := &http.Client{Timeout: 30 * time.Second}
				req, _ := http.NewRequest(http.MethodPost, s.url+tt.path, strings.NewReader(tt.body))
				if tt.noContinue {
					req.Header.Set("X-Sluice-Continue", "off")
				}
				resp, err := client.Do(req)
				if err != nil {
					close(started)
					done <- result{err: err}
					return
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				var rest strings.Builder
				for { // up to the first token's event
					line, err := br.ReadString('\n')
					if err != nil {
						close(started)
						done <- result{rest: line, err: fmt.Errorf("the stream ended before its first token: %w", err)}
						return
					}
					if strings.Contains(line, `"content"`) || strings.Contains(line, `"text_delta"`) {
						break
					}
				}
				close(started)
				_, err = io.Copy(&rest, br)
				done <- result{rest: rest.String(), err: err}
			}()
			<-started
			s.cancel() // SIGTERM, with no drain delay
			grace := <-phases
			close(grace.release) // the grace period ends with the stream running
			window := <-phases
			res := <-done
			close(window.release)
			if err := s.stop(); err != nil {
				t.Fatalf("Serve: %v", err)
			}
			if res.err != nil {
				t.Fatalf("reading the stream: %v (read %q)", res.err, res.rest)
			}
			rest := strings.TrimRight(res.rest, "\n")
			if !strings.HasSuffix(rest, tt.want) || strings.Contains(rest, "[DONE]") {
				t.Fatalf("the stream cut by the shutdown ended\n%q\nwant it to end with\n%q\nand no [DONE]", lastLines(rest, 3), tt.want)
			}
		})
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
