package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// TestServer_TokenizeSurvivesAClosedPooledConnection: /tokenize is sent on
// the connections the probes left in the pool, which this worker closes
// as soon as a second request arrives on them (an idle keep-alive timeout
// beaten by a hair). Counting tokens changes nothing, so the request is
// marked idempotent and the transport resends it on a new connection.
func TestServer_TokenizeSurvivesAClosedPooledConnection(t *testing.T) {
	var dropped atomic.Int32
	ws := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connRequests{}).(*atomic.Int32).Add(1)
		switch r.URL.Path {
		case "/tokenize":
			if n > 1 {
				dropped.Add(1)
				c, _, _ := w.(http.Hijacker).Hijack()
				c.Close()
				return
			}
			io.WriteString(w, `{"tokens":[1,2,3]}`)
		case "/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	ws.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int32))
	}
	ws.Start()
	defer ws.Close()
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: ws.URL, Kind: "vllm", Models: []string{"m"}}}
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background()) // leaves a used connection in the pool
	out, err := r.srv.postTokenize(context.Background(), "gpu0", map[string]any{"model": "m", "prompt": "three tokens here"})
	if err != nil || len(out.Tokens) != 3 {
		t.Fatalf("tokenize = %v, %v; want 3 tokens", out.Tokens, err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no /tokenize met a closed pooled connection; the test proves nothing")
	}
}
