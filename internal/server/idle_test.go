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
)

// TestRouter_StalledStreamIsCutOffAndFreesItsSlot has a worker send its
// headers and one chunk, then go silent. The router must end the client's
// stream with an error event, hang up on the worker, free the slot and
// count the failure against the worker.
func TestRouter_StalledStreamIsCutOffAndFreesItsSlot(t *testing.T) {
	hungUp := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select { // stall until the router hangs up
		case <-r.Context().Done():
			close(hungUp)
		case <-release:
		}
	}))
	defer ws.Close()
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: ws.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1}}
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	cfg.Proxy.StreamIdleTimeout = 50 * time.Millisecond // the behaviour under test
	r := startRouter(t, cfg)

	resp := post(t, context.Background(), r.url, chat("x", true))
	body := readAll(t, resp) // returns when the router ends the stream
	if resp.StatusCode != 200 || !strings.Contains(body, `"t0"`) || !strings.Contains(body, `"code":"stream_idle"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("status %d body %q: want the first chunk, then a stream_idle error event", resp.StatusCode, body)
	}
	<-hungUp
	waitFor(t, r, func() bool { return r.srv.Scheduler().Workers()[0].Active == 0 })
	if st := r.srv.fleet.Get("gpu0").State(); st.ConsecutiveFailures != 1 || !strings.Contains(st.Reason, "sent nothing") {
		t.Fatalf("worker state %+v: want one failure that says the worker sent nothing", st)
	}
}

func TestConfig_StreamIdleTimeoutMustBePositive(t *testing.T) {
	err := config.Check("", []byte("workers: [{name: a, url: 'http://127.0.0.1:1'}]\nproxy: {stream_idle_timeout: 0s}\n")).Err()
	if err == nil || !strings.Contains(err.Error(), "proxy.stream_idle_timeout") {
		t.Fatalf("err %v, want one naming proxy.stream_idle_timeout", err)
	}
}
