package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// termFunc is a score term that runs score, then scores nothing.
type termFunc struct{ score func() }

func (termFunc) Name() string { return "test" }
func (termFunc) Reward() bool { return false }
func (t termFunc) Score(_ *scheduler.Env, _ []scheduler.Candidate, _, norm []float64) {
	t.score()
	clear(norm)
}
func (termFunc) Provenance(*scheduler.Env, *scheduler.Candidate) (string, time.Time, bool) {
	return "", time.Time{}, false
}

// observerFunc is an Observer that calls observe.
type observerFunc func()

func (f observerFunc) Observe(string, stats.Observation, time.Time) { f() }

// panicWriter is a ResponseWriter whose writes of the body panic once
// they hold mark.
type panicWriter struct {
	http.ResponseWriter
	mark string
}

func (w panicWriter) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte(w.mark)) {
		panic("relay panics")
	}
	return w.ResponseWriter.Write(b)
}

func (w panicWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// panicOnce is a wrapper of the Handler whose first request's writes of
// mark panic.
func panicOnce(once *atomic.Bool, mark string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if once.CompareAndSwap(true, false) {
				w = panicWriter{w, mark}
			}
			h.ServeHTTP(w, r)
		})
	}
}

// A panic anywhere in a request's path — in a score term while the
// scheduler's lock is held, in the observer that Lease.Complete calls
// under it, in the relay of an answer or of a stream's continuation —
// ends that request only (net/http recovers it and drops the
// connection): the router serves the next request, and every slot is
// back, no request left in flight.
func TestHandler_PanicReturnsEverySlot(t *testing.T) {
	const whole = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	for _, tt := range []struct {
		name    string
		body    string
		workers []http.HandlerFunc
		arm     func(cfg *scheduler.Config, opt *Options, once *atomic.Bool) func(http.Handler) http.Handler
	}{
		{"score term", whole, []http.HandlerFunc{jsonWorker()}, func(cfg *scheduler.Config, _ *Options, once *atomic.Bool) func(http.Handler) http.Handler {
			cfg.Terms = append(scheduler.DefaultTerms(scheduler.DefaultWeights()), scheduler.WeightedTerm{Term: termFunc{func() {
				if once.CompareAndSwap(true, false) {
					panic("term panics")
				}
			}}, Weight: 1})
			return nil
		}},
		{"observer", whole, []http.HandlerFunc{jsonWorker()}, func(_ *scheduler.Config, opt *Options, once *atomic.Bool) func(http.Handler) http.Handler {
			opt.Observer = observerFunc(func() {
				if once.CompareAndSwap(true, false) {
					panic("observer panics")
				}
			})
			return nil
		}},
		{"relay", whole, []http.HandlerFunc{jsonWorker()}, func(_ *scheduler.Config, _ *Options, once *atomic.Bool) func(http.Handler) http.Handler {
			return panicOnce(once, "")
		}},
		// w0 breaks the stream; its continuation on w1 panics as it is
		// relayed (the next request is continued there whole).
		{"relay of a continuation", chatStreamBody, []http.HandlerFunc{breakingWorker(3), streamWorker("u", 3)}, func(_ *scheduler.Config, opt *Options, once *atomic.Bool) func(http.Handler) http.Handler {
			opt.MaxContinuations = 1
			return panicOnce(once, " u0")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var once atomic.Bool
			once.Store(true)
			var cfg scheduler.Config
			var opt Options
			wrap := tt.arm(&cfg, &opt, &once)
			var ws []testWorker
			for i, h := range tt.workers {
				ws = append(ws, startWorker(t, fmt.Sprint("w", i), h))
			}
			r := newTestRouter(t, cfg, opt, wrap, ws...)
			r.post("/v1/chat/completions", tt.body) // the connection dropped by the panic
			if once.Load() {
				t.Fatal("the first request did not panic")
			}
			within(t, "the next request", func() {
				if status, got, _ := r.post("/v1/chat/completions", tt.body); status != http.StatusOK || strings.Contains(got, `"error"`) {
					t.Errorf("next request: status %d, %q; want 200 and the answer", status, got)
				}
			})
			within(t, "reading the scheduler", func() {
				if got := r.inFlight(); len(got) != 0 {
					t.Errorf("in flight after both requests ended: %v, want none", got)
				}
			})
		})
	}
}

// jsonWorker answers a chat completion whole.
func jsonWorker() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}
}

// within runs f, failing the test if it has not returned in 10 seconds:
// a router that hangs must fail the test, not stop it.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a bound on failure, not a wait
		t.Fatalf("%s hangs: still waiting after 10s", what)
	}
}
