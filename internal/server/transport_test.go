package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
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
		made, err := wt.forWorker(config.Worker{Name: tc.kind, URL: tc.url, Kind: tc.kind})
		if err != nil {
			t.Fatal(err)
		}
		wt.install(hostKey(u), made)
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

// TestRouter_KeepsAConnectionPerSlotAcrossBursts: a burst of more
// requests than http.DefaultTransport keeps idle (100) hands its
// connections back when it ends, and the next burst of the same size
// reuses them all instead of dialling the worker again.
func TestRouter_KeepsAConnectionPerSlotAcrossBursts(t *testing.T) {
	const n = 120
	var mu sync.Mutex
	conns := 0
	arrived := make(chan struct{}, n)
	var release chan struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
			return
		}
		mu.Lock()
		ch := release
		mu.Unlock()
		arrived <- struct{}{}
		<-ch
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"completion_tokens":1}}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	cfg := faultConfig(t, []string{srv.URL}, func(c *config.Config) {
		c.Workers[0].MaxConcurrency = n
		c.Limits.Learning.Fixed = true
		c.Admission.MaxQueue = n
	})
	r := startRouter(t, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	burst := func() int {
		mu.Lock()
		release = make(chan struct{})
		before := conns
		mu.Unlock()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				resp, err := client.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
				}
			})
		}
		for range n {
			<-arrived // all n at the worker at once, each on a connection of its own
		}
		mu.Lock()
		close(release)
		mu.Unlock()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return conns - before
	}
	if got := burst(); got < n-1 { // one may be the telemetry probe's
		t.Fatalf("the first burst of %d opened %d connections to the worker", n, got)
	}
	if got := burst(); got != 0 {
		t.Fatalf("the second burst of %d opened %d new connections to the worker, want 0: idle ones were closed between bursts", n, got)
	}
}
