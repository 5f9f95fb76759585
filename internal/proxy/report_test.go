package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// A stream broken by its worker and continued on a worker that fails the
// continuation (500 before any byte) counts one failure against each:
// two, counted twice, would eject the second after two real failures at
// the default telemetry.fail_threshold of 3.
func TestContinuation_FailedContinuationIsReportedOnce(t *testing.T) {
	a := startWorker(t, "a", breakingWorker(3))
	b := startWorker(t, "b", failingWorker(http.StatusInternalServerError, "boom"))
	r := newTestRouter(t, scheduler.Config{}, Options{MaxContinuations: 1}, nil, a, b)

	status, body, _ := r.post("/v1/chat/completions", chatStreamBody)
	if status != http.StatusOK || !strings.Contains(body, `"code":"upstream_failed"`) {
		t.Fatalf("status %d, body %q; want 200 ending in Sluice's upstream_failed event", status, body)
	}
	for _, w := range []string{"a", "b"} {
		if got := r.rep.failures(w); len(got) != 1 {
			t.Errorf("worker %s: %d failures reported %q, want 1", w, len(got), got)
		}
	}
	if got := r.inFlight(); len(got) != 0 {
		t.Errorf("in flight after the request: %v, want none", got)
	}
}

// A continuation whose worker's drain deadline passes before it answers
// is taken back from it, and that is no failure of the worker's.
func TestContinuation_DrainIsNotTheWorkersFailure(t *testing.T) {
	reached := make(chan struct{}, 1)
	a := startWorker(t, "a", breakingWorker(3))
	b := startWorker(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server sees the router hang up
		reached <- struct{}{}
		<-r.Context().Done() // answers nothing until the router gives up
	}))
	r := newTestRouter(t, scheduler.Config{}, Options{MaxContinuations: 2}, nil, a, b)

	type answer struct {
		status int
		body   string
	}
	got := make(chan answer, 1)
	go func() {
		status, body, _ := r.post("/v1/chat/completions", chatStreamBody)
		got <- answer{status, body}
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second): // a bound on failure, not a wait
		t.Fatal("the continuation never reached worker b")
	}
	if n := r.h.live.move("b"); n != 1 {
		t.Fatalf("the drain moved %d streams from b, want 1", n)
	}
	ans := <-got
	if ans.status != http.StatusOK || !strings.Contains(ans.body, `"code":"upstream_failed"`) {
		t.Fatalf("status %d, body %q; want 200 ending in Sluice's upstream_failed event (no worker left to continue)", ans.status, ans.body)
	}
	if got := r.rep.failures("b"); len(got) != 0 {
		t.Errorf("worker b, drained: failures reported %q, want none", got)
	}
	if got := r.rep.failures("a"); len(got) != 1 {
		t.Errorf("worker a, which broke the stream: failures reported %q, want 1", got)
	}
}
