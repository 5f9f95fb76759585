package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

func TestWorkerTransport_IdleTimeoutOfTheWorkersKind(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Proxy.IdleConnTimeout["openai"] = 7 * time.Second
	wt := newWorkerTransport(http.DefaultTransport.(*http.Transport).Clone(), cfg.Proxy.IdleConnTimeoutFor)
	for _, tc := range []struct {
		kind, url string
		want      time.Duration
	}{
		{"llamacpp", "http://10.0.0.1:8080", 4 * time.Second}, // under llama-server's 5 s
		{"vllm", "http://10.0.0.2:8000", 4 * time.Second},
		{"ollama", "http://10.0.0.3:11434", config.DefaultIdleConnTimeout},
		{"openai", "http://10.0.0.4:80", 7 * time.Second},
	} {
		u, _ := url.Parse(tc.url)
		if err := wt.register(config.Worker{Name: tc.kind, URL: tc.url, Kind: tc.kind}, u); err != nil {
			t.Fatal(err)
		}
		v, ok := wt.byHost.Load(u.Scheme + "://" + u.Host)
		if !ok {
			t.Fatalf("%s: no transport of its own", tc.kind)
		}
		ht := v.(*hostTransport)
		if got := ht.pooled.IdleConnTimeout; got != tc.want {
			t.Errorf("%s: idle timeout %v, want %v", tc.kind, got, tc.want)
		}
		if !ht.fresh.DisableKeepAlives || ht.pooled.DisableKeepAlives {
			t.Errorf("%s: fresh keeps alive %v, pooled %v", tc.kind, !ht.fresh.DisableKeepAlives, !ht.pooled.DisableKeepAlives)
		}
	}
}

// TestRouter_ClosesIdleWorkerConnectionsFirst: the worker never closes
// an idle connection itself here, so the connection of the router's
// first probe ends only if the router closes it, after the idle timeout
// of the worker's kind (the default would be 90 s).
func TestRouter_ClosesIdleWorkerConnectionsFirst(t *testing.T) {
	closed := make(chan struct{}, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	cfg := faultConfig(t, []string{srv.URL}, func(c *config.Config) {
		c.Proxy.IdleConnTimeout["openai"] = 50 * time.Millisecond
	})
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background())
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the router kept its idle connection to the worker for 10s; want it closed after 50ms")
	}
}
