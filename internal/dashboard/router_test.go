package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/server"
	"github.com/sluice-router/sluice/internal/sim"
)

// router is a Sluice router on loopback in front of a simulated fleet.
type router struct {
	url   string
	model string
	fleet *sim.Fleet
	srv   *server.Server
}

// startRouter starts n workers of the demo fleet, sped up by scale, and a
// router in front of them; tune may change the config first.
func startRouter(t *testing.T, n int, scale float64, tune func(*config.Config)) *router {
	t.Helper()
	specs := sim.DemoFleet()[:n]
	for i := range specs {
		specs[i].TimeScale = scale
		specs[i].Params.StartupDelay = 0
	}
	fl, err := sim.StartFleet(context.Background(), specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Close)
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval = 50 * time.Millisecond
	cfg.Telemetry.Timeout = time.Second
	cfg.Telemetry.StaleAfter = 2 * time.Second
	model := specs[0].Params.Model
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: "llamacpp",
			Models: []string{model}, GPUMetrics: w.URL + "/dcgm/metrics"})
	}
	if tune != nil {
		tune(&cfg)
	}
	srv, err := server.New(cfg, server.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	srv.ScrapeNow(context.Background())
	return &router{url: hs.URL, model: model, fleet: fl, srv: srv}
}

// chat sends one chat completion and returns the response with its body
// read.
func (r *router) chat(ctx context.Context, client *http.Client, stream bool, maxTokens int) (*http.Response, string, error) {
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"hello"}]}`, r.model, stream, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// load drives clients closed-loop streams at the router until stop is
// called or max requests were sent; stop returns once every request has
// ended.
type load struct {
	cancel context.CancelFunc
	quit   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	status map[int]int
	errs   []error
}

func (r *router) startLoad(t *testing.T, clients, max int) *load {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	l := &load{cancel: cancel, quit: make(chan struct{}), status: map[int]int{}}
	client := &http.Client{}
	var sent sync.Mutex
	n := 0
	for c := range clients {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				sent.Lock()
				n++
				over := n > max
				sent.Unlock()
				select {
				case <-l.quit:
					return
				default:
				}
				if over || ctx.Err() != nil {
					return
				}
				resp, _, err := r.chat(ctx, client, true, []int{16, 48, 96, 160}[(c+i)%4])
				l.mu.Lock()
				switch {
				case err != nil && ctx.Err() == nil:
					l.errs = append(l.errs, err)
				case err == nil:
					l.status[resp.StatusCode]++
				}
				l.mu.Unlock()
				if err == nil && resp.StatusCode == http.StatusTooManyRequests {
					select { // a refused client backs off a little, as real ones do
					case <-ctx.Done():
					case <-l.quit:
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		})
	}
	t.Cleanup(l.stop)
	return l
}

// stop sends no more requests and waits for those in flight to finish.
func (l *load) stop() {
	l.once.Do(func() { close(l.quit) })
	l.wg.Wait()
	l.cancel()
}

func (l *load) statuses() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]int{}
	for k, v := range l.status {
		out[k] = v
	}
	return out
}
