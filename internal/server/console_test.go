package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/config"
)

// logged is one log record: its level, message and attributes as text.
type logged struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// chanHandler sends every record at level or above to records.
type chanHandler struct {
	level   slog.Level
	records chan logged
	attrs   []slog.Attr
}

func (h *chanHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *chanHandler) Handle(_ context.Context, r slog.Record) error {
	l := logged{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		l.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { l.attrs[a.Key] = a.Value.String(); return true })
	h.records <- l
	return nil
}
func (h *chanHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &chanHandler{level: h.level, records: h.records, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *chanHandler) WithGroup(string) slog.Handler { return h }

// serving is a router serving on loopback through Serve, stopped by the
// test with the cause it chooses.
type serving struct {
	srv  *Server
	url  string
	stop context.CancelCauseFunc
	errc chan error
}

func startServing(t *testing.T, cfg config.Config, log *slog.Logger, prepare func(*Server)) *serving {
	t.Helper()
	srv, err := New(cfg, Options{Logger: log})
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
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &serving{srv: srv, url: "http://" + ln.Addr().String(), stop: cancel, errc: make(chan error, 1)}
	go func() { s.errc <- srv.Serve(ctx, ln, 0) }()
	t.Cleanup(func() {
		cancel(nil)
		srv.Close()
	})
	return s
}

// TestConsole_OneTrafficLineNotOneLinePerDecision checks what a person
// watching the console sees at the default level: no line per decision,
// one traffic line per interval with the requests, outcomes, queue and
// time to first token, one more when the router goes idle, then silence.
func TestConsole_OneTrafficLineNotOneLinePerDecision(t *testing.T) {
	records := make(chan logged, 100)
	log := slog.New(&chanHandler{level: slog.LevelInfo, records: records})
	tick := make(chan time.Time) // unbuffered: a send returns once the last tick is handled
	s := startServing(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, quickShutdown), log, func(srv *Server) {
		srv.summaryTick = tick
	})
	send := func(body string) int {
		t.Helper()
		resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-s.srv.idle // the request has ended and been counted
		return resp.StatusCode
	}
	for i, want := range []int{200, 200, 200, 400} {
		body := chat("r", true)
		if want == 400 {
			body = `{"model":"m","stream":"yes"}`
		}
		if got := send(body); got != want {
			t.Fatalf("request %d: status %d, want %d", i, got, want)
		}
	}
	drain := func() []logged {
		var out []logged
		for {
			select {
			case r := <-records:
				out = append(out, r)
			default:
				return out
			}
		}
	}
	for _, r := range drain() {
		if r.msg == "decision" {
			t.Errorf("a decision logged at %v on the default console: %v", r.level, r.attrs)
		}
	}

	// A send returns once the tick before it was handled: the third send
	// makes sure the first tick's line and the second's (the router went
	// idle) are written; the third finds nothing new.
	tick <- time.Time{}
	tick <- time.Time{}
	tick <- time.Time{}
	lines := drain()
	var traffic []map[string]string
	for _, r := range lines {
		if r.msg == "traffic" {
			if _, ok := r.attrs["ttft_p50_ms"]; !ok && r.attrs["ok"] != "0" {
				t.Errorf("traffic line of streamed answers without ttft_p50_ms: %v", r.attrs)
			}
			delete(r.attrs, "ttft_p50_ms")
			delete(r.attrs, "ttft_p95_ms")
			traffic = append(traffic, r.attrs)
		}
	}
	want := []map[string]string{
		{"requests": "4", "ok": "3", "errors": "1", "error_reasons": "invalid_request=1", "queued": "0", "running": "0"},
		{"requests": "0", "ok": "0", "errors": "0", "queued": "0", "running": "0"},
	}
	if diff := cmp.Diff(want, traffic); diff != "" {
		t.Errorf("traffic lines (-want +got):\n%s", diff)
	}
	tick <- time.Time{}
	tick <- time.Time{}
	tick <- time.Time{} // the two before it handled
	for _, r := range drain() {
		if r.msg == "traffic" {
			t.Errorf("an idle router logged a traffic line again: %v", r.attrs)
		}
	}
}

// TestServe_DrainDelayOnlyWhenSomethingNeedsIt checks the drain delay on
// shutdown: SIGTERM (an orchestrator, a load balancer watching /readyz)
// always waits it; Ctrl-C (ErrInterrupted) with nothing in flight stops
// at once, and with a request in flight waits only until it ends.
func TestServe_DrainDelayOnlyWhenSomethingNeedsIt(t *testing.T) {
	const drain = 5 * time.Second
	tests := []struct {
		name      string
		cause     error
		inFlight  bool
		waitDrain bool // Serve starts the drain delay
		release   bool // and only the delay's end lets it go on
	}{
		{"ctrl-c, nothing in flight: at once", ErrInterrupted, false, false, false},
		{"ctrl-c, a request in flight: until it ends", ErrInterrupted, true, true, false},
		{"sigterm, nothing in flight: the drain delay", nil, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newFakeWorker(t, "w1")
			w.hold = make(chan struct{})
			w.arrived = make(chan string, 1)
			cfg := testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
				c.Shutdown.DrainDelay = drain
				c.Shutdown.Grace = 30 * time.Second
			})
			waits := make(chan time.Duration, 8)
			released := make(chan time.Time)
			s := startServing(t, cfg, slog.New(slog.DiscardHandler), func(srv *Server) {
				srv.after = func(d time.Duration) <-chan time.Time {
					waits <- d
					if d == drain {
						return released
					}
					return nil // the grace and refuse windows never end here
				}
			})
			done := make(chan int, 1)
			if tt.inFlight {
				go func() {
					resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(chat("a", true)))
					if err != nil {
						done <- 0
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					done <- resp.StatusCode
				}()
				<-w.arrived
			}
			s.stop(tt.cause)
			var sawDrain bool
			for {
				select {
				case d := <-waits:
					if d != drain {
						continue
					}
					sawDrain = true
					if !tt.waitDrain {
						t.Fatal("Serve waits the drain delay with nothing in flight after Ctrl-C")
					}
					if tt.inFlight {
						w.hold <- struct{}{} // the request ends: the delay must end with it
						if got := <-done; got != 200 {
							t.Errorf("request in flight across shutdown: status %d", got)
						}
					}
					if tt.release {
						close(released)
					}
					continue
				case err := <-s.errc:
					if err != nil {
						t.Fatalf("Serve: %v", err)
					}
				case <-time.After(10 * time.Second): // a guard: failing beats hanging
					t.Fatalf("Serve has not returned (drain delay started: %v)", sawDrain)
				}
				break
			}
			if sawDrain != tt.waitDrain {
				t.Errorf("drain delay started: %v, want %v", sawDrain, tt.waitDrain)
			}
		})
	}
}
