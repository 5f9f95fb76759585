package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

// soakResult is what a soak run counted.
type soakResult struct {
	clients                         int
	full, errEvent, refused, hungUp int
	unclear                         []string
	handled, sent                   map[string]int // per request id: router handler runs, sends to workers
	modes                           []int          // per client: 0 reads to the end, 1–3 hangs up (see runSoak)
	ttft, e2e                       []time.Duration
	cpu                             time.Duration
	wall                            time.Duration
	activeAfter, queuedAfter        int
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingTransport counts the sends of each request id to workers.
type countingTransport struct {
	http.RoundTripper
	mu   sync.Mutex
	sent map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if id := r.Header.Get("X-Soak-Id"); id != "" {
		c.mu.Lock()
		c.sent[id]++
		c.mu.Unlock()
	}
	return c.RoundTripper.RoundTrip(r)
}

// runSoak sends n concurrent streaming clients through a router in front
// of a simulated fleet on loopback. About a fifth of the clients hang up
// at a seeded random point: right after sending, after the headers, or
// after a few events.
func runSoak(tb testing.TB, n int, seed uint64) soakResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const workers, slots = 4, 64
	specs := make([]sim.WorkerSpec, workers)
	for i := range specs {
		p := sim.DefaultParams()
		p.Slots, p.Seed = slots, int64(i+1)
		p.OutputMedian, p.OutputMin, p.OutputMax = 20, 5, 40
		p.InterferenceScale = 0
		specs[i] = sim.WorkerSpec{Name: fmt.Sprintf("sim-%d", i), Params: p, TimeScale: 100}
	}
	fl, err := sim.StartFleet(ctx, specs, "127.0.0.1", 0, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer fl.Close()
	cfg := config.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admission.MaxQueue = n
	cfg.Admission.QueueTimeout = 5 * time.Minute
	cfg.Shutdown.DrainDelay = 0
	cfg.Telemetry.Interval = 50 * time.Millisecond
	cfg.Telemetry.StaleAfter = time.Second
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: "llamacpp", MaxConcurrency: slots})
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	base := &http.Transport{MaxIdleConnsPerHost: workers * slots, IdleConnTimeout: time.Minute, DisableCompression: true}
	ct := &countingTransport{RoundTripper: base, sent: map[string]int{}}
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), Transport: ct})
	if err != nil {
		tb.Fatal(err)
	}
	res := soakResult{clients: n, handled: map[string]int{}, sent: ct.sent}
	var hmu sync.Mutex
	running := map[string]bool{} // ids whose router handler has started and not returned
	modes := make([]int, n)      // each client's hang-up mode, to name a stuck request's
	finished := make(chan struct{}, 2*n)
	inner := srv.handler
	srv.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Soak-Id")
		if id != "" {
			hmu.Lock()
			running[id] = true
			hmu.Unlock()
		}
		inner.ServeHTTP(w, r)
		if id != "" {
			hmu.Lock()
			res.handled[id]++
			delete(running, id)
			hmu.Unlock()
			finished <- struct{}{}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	serveCtx, stopServe := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx, ln, 10*time.Second) }()
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"
	model := specs[0].Params.Model
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0, DisableCompression: true}}

	var mu sync.Mutex
	record := func(f func()) { mu.Lock(); f(); mu.Unlock() }
	var wg sync.WaitGroup
	var start sync.WaitGroup
	start.Add(1)
	cpu0, wall0 := cpuTime(), time.Now()
	for i := range n {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		mode := 0 // read to the end
		if rng.IntN(5) == 0 {
			mode = 1 + rng.IntN(3) // 1: after sending, 2: after headers, 3: after k events
		}
		modes[i] = mode
		k := 1 + rng.IntN(5)
		maxTokens := 5 + rng.IntN(36)
		id := fmt.Sprintf("c%d", i)
		wg.Go(func() {
			start.Wait()
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			if mode == 1 {
				rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { rcancel() }})
			}
			body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"soak %d"}]}`, model, maxTokens, i)
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("X-Soak-Id", id)
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				if mode == 1 {
					record(func() { res.hungUp++ })
					return
				}
				record(func() { res.unclear = append(res.unclear, id+": "+err.Error()) })
				return
			}
			defer resp.Body.Close()
			if mode == 2 {
				record(func() { res.hungUp++ })
				return
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				if resp.Header.Get("X-Sluice-Reason") != "" && strings.Contains(string(b), `"error"`) {
					record(func() { res.refused++ })
				} else {
					record(func() { res.unclear = append(res.unclear, fmt.Sprintf("%s: %d %q", id, resp.StatusCode, b)) })
				}
				return
			}
			br := bufio.NewReader(resp.Body)
			events, done, failed := 0, false, false
			var ttft time.Duration
			for {
				line, err := br.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					switch {
					case strings.HasPrefix(line, "data: [DONE]"):
						done = true
					case strings.Contains(line, `"error"`):
						failed = true
					default:
						if events == 0 {
							ttft = time.Since(t0)
						}
						events++
					}
				}
				if mode == 3 && events >= k {
					rcancel()
					record(func() { res.hungUp++ })
					return
				}
				if err != nil {
					break
				}
			}
			e2e := time.Since(t0)
			record(func() {
				switch {
				case done && !failed:
					res.full++
					res.ttft = append(res.ttft, ttft)
					res.e2e = append(res.e2e, e2e)
				case failed:
					res.errEvent++
				case mode == 3: // the answer was shorter than k events
					res.full++
				default:
					res.unclear = append(res.unclear, fmt.Sprintf("%s: stream ended after %d events without [DONE] or an error", id, events))
				}
			})
		})
	}
	start.Done()
	wg.Wait()
	res.cpu, res.wall = cpuTime()-cpu0, time.Since(wall0)
	client.CloseIdleConnections()
	// Hung-up requests finish on the router side shortly after the client
	// left; wait for every handler before counting. A client that hung up
	// right after sending (mode 1) may have left before the router read
	// its request, which then never reaches a handler; every other
	// client's request did, since it got an answer's headers. The
	// deadline only turns a handler that never returns into a failure
	// that names it: it is generous, since a loaded CI machine running
	// -race is slow.
	settled := func() bool { // under hmu
		if len(running) > 0 {
			return false
		}
		for i, m := range modes {
			if m != 1 && res.handled[fmt.Sprintf("c%d", i)] == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.After(2 * time.Minute)
	for {
		hmu.Lock()
		ok := settled()
		hmu.Unlock()
		if ok {
			break
		}
		select {
		case <-finished:
		case <-deadline:
			hmu.Lock()
			var stuck, never []string
			for i, m := range modes {
				id := fmt.Sprintf("c%d", i)
				switch {
				case running[id]:
					stuck = append(stuck, fmt.Sprintf("%s (hang-up mode %d)", id, m))
				case res.handled[id] == 0:
					never = append(never, fmt.Sprintf("%s (hang-up mode %d)", id, m))
				}
			}
			hmu.Unlock()
			active := 0
			for _, ws := range srv.Scheduler().Workers() {
				active += ws.Active
			}
			tb.Fatalf("requests unfinished on the router after 2m: %d handlers still running %v, %d never started %v; router: %d active, %d queued",
				len(stuck), stuck[:min(len(stuck), 10)], len(never), never[:min(len(never), 10)], active, srv.Scheduler().QueueDepth(model))
		}
	}
	for _, ws := range srv.Scheduler().Workers() {
		res.activeAfter += ws.Active
	}
	res.queuedAfter = srv.Scheduler().QueueDepth(model)
	stopServe()
	if err := <-served; err != nil {
		tb.Errorf("Serve: %v", err)
	}
	hmu.Lock() // a late mode-1 request's handler has returned by now
	res.handled = maps.Clone(res.handled)
	res.modes = modes
	hmu.Unlock()
	srv.Close()
	base.CloseIdleConnections()
	fl.Close()
	return res
}

// check asserts the soak's invariants: every request handled exactly
// once (at most once if its client hung up right after sending: it may
// have left before the router read it), none sent to a worker twice, every client that stayed got a full
// answer or a clear error, and nothing left in flight or queued.
func (r soakResult) check(tb testing.TB) {
	tb.Helper()
	for _, u := range r.unclear[:min(len(r.unclear), 10)] {
		tb.Errorf("unclear outcome: %s", u)
	}
	if got := r.full + r.errEvent + r.refused + r.hungUp + len(r.unclear); got != r.clients {
		tb.Errorf("%d outcomes for %d clients", got, r.clients)
	}
	for i := range r.clients {
		id := fmt.Sprintf("c%d", i)
		switch h := r.handled[id]; {
		case r.modes[i] == 1 && h > 1:
			tb.Errorf("request %s (hung up after sending) handled %d times, want at most once", id, h)
		case r.modes[i] != 1 && h != 1:
			tb.Errorf("request %s handled %d times, want once", id, h)
		}
		if r.sent[id] > 1 {
			tb.Errorf("request %s sent to workers %d times (no worker failed, so no retry was due)", id, r.sent[id])
		}
	}
	if r.activeAfter != 0 || r.queuedAfter != 0 {
		tb.Errorf("after the soak: %d requests active, %d queued; want none", r.activeAfter, r.queuedAfter)
	}
	if r.full == 0 {
		tb.Error("no client got a full answer")
	}
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func TestSoak_ConcurrentClientsAreAllAccountedFor(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r := runSoak(t, 200, 1)
	r.check(t)
	t.Logf("200 clients: %d full, %d error events, %d refused, %d hung up; e2e p99 %v", r.full, r.errEvent, r.refused, r.hungUp, pct(r.e2e, 0.99))
}

// raiseFileLimit lifts the open-file limit as far as allowed and returns
// it: a soak holds four descriptors per stream in this one process
// (client and router ends, router and worker ends).
func raiseFileLimit() uint64 {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	want := syscall.Rlimit{Cur: 1 << 16, Max: max(lim.Max, 1<<16)}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
		return want.Cur
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

// BenchmarkSoak runs 5,000 concurrent streaming clients (fewer if the
// open-file limit cannot hold them) through the router in front of a
// simulated fleet, with random hang-ups, and checks the soak invariants.
// cpu-µs/req is the whole process (clients, router and simulated fleet).
func BenchmarkSoak(b *testing.B) {
	limit := raiseFileLimit()
	n := 5000
	if fit := int(limit-512) / 4; fit < n {
		b.Logf("open-file limit %d holds %d streams, not %d", limit, fit, n)
		n = fit
	}
	b.Logf("open-file limit %d; %d clients", limit, n)
	for i := 0; b.Loop(); i++ {
		r := runSoak(b, n, uint64(i+1))
		r.check(b)
		b.ReportMetric(float64(r.cpu.Microseconds())/float64(n), "cpu-µs/req")
		b.ReportMetric(float64(pct(r.ttft, 0.99).Microseconds())/1000, "ttft-p99-ms")
		b.ReportMetric(float64(pct(r.e2e, 0.99).Microseconds())/1000, "e2e-p99-ms")
		b.ReportMetric(float64(r.full), "full")
		b.ReportMetric(float64(r.hungUp), "hung-up")
		b.ReportMetric(float64(r.refused+r.errEvent), "errors")
	}
}

// BenchmarkSoakOverhead holds 1,000 streams open at once, straight to
// four loopback workers and then through the router. While they are open
// it sends 200 short requests one after another and reports their
// latency (p50, p99) direct and through the router: the difference is
// what Sluice adds at 1,000 concurrent streams. cpu-µs/req (and, by its
// older name, router-cpu-µs/req) is the router's CPU per request: (CPU
// through the router - CPU direct) / requests, with the same clients and
// workers in both runs. httputil-cpu-µs/req is the same for a bare
// net/http/httputil.ReverseProxy over the same workers: the floor any Go
// proxy on net/http starts from.
func BenchmarkSoakOverhead(b *testing.B) { soakOverhead(b, "") }

// BenchmarkSoakOverheadVsNginx is BenchmarkSoakOverhead with a third
// round in the same run: the same streams and probes through nginx
// (proxy_buffering off, least_conn upstream, HTTP/1.1 keep-alive to the
// workers), started from a generated config on loopback as one process
// (master_process off) whose CPU is read from /proc/<pid>/stat. It
// reports nginx-cpu-µs/req and cpu-ratio, Sluice's CPU per request over
// nginx's. It is skipped where nginx is not installed.
func BenchmarkSoakOverheadVsNginx(b *testing.B) {
	path, err := exec.LookPath("nginx")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
			if _, serr := os.Stat(p); serr == nil {
				path, err = p, nil
			}
		}
	}
	if err != nil {
		b.Skip("nginx is not installed (apt-get install nginx): no comparison to make")
	}
	soakOverhead(b, path)
}

func soakOverhead(b *testing.B, nginxPath string) {
	raiseFileLimit()
	const streams, workers, probes = 1000, 4, 200
	var open atomic.Int64
	release := make(chan struct{})
	var relMu sync.Mutex
	worker := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"completion_tokens":1}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, tok)
		relMu.Lock()
		ch := release
		relMu.Unlock()
		// Counted before the first byte leaves: once the client has it,
		// the stream is open here, however the goroutines are scheduled.
		open.Add(1)
		w.(http.Flusher).Flush()
		<-ch // every stream stays open until the probes are done
		io.WriteString(w, tok+"data: [DONE]\n\n")
	})
	var urls []string
	for range workers {
		s := newLoopbackServer(worker)
		defer s.Close()
		urls = append(urls, s.URL)
	}
	cfg := config.DefaultConfig()
	cfg.Admission.MaxQueue = streams
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	// The streams are held open on purpose: the limit must be the cap,
	// not one learned from streams that never finish.
	cfg.Limits.Learning.Fixed = true
	for i, u := range urls {
		// Room for the probes next to the held streams: they must not queue.
		cfg.Workers = append(cfg.Workers, config.Worker{Name: fmt.Sprintf("w%d", i), URL: u, Kind: "openai", Models: []string{"m"}, MaxConcurrency: streams/workers + 16})
	}
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	router := newLoopbackServer(srv.Handler())
	defer router.Close()
	// bare is the floor of a Go proxy: net/http's httputil.ReverseProxy,
	// round-robin over the same workers with as many idle connections,
	// flushing every write, and nothing else. What Sluice costs above it
	// is scheduling, metering and records; what it costs below nginx's
	// is net/http.
	var rr atomic.Int64
	bareTransport := &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}
	defer bareTransport.CloseIdleConnections()
	bare := newLoopbackServer(&httputil.ReverseProxy{Transport: bareTransport, FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			u, err := url.Parse(urls[rr.Add(1)%workers])
			if err != nil {
				panic(err)
			}
			pr.SetURL(u)
		}})
	defer bare.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	probeClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	defer probeClient.CloseIdleConnections()
	streamBody := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	probeBody := `{"model":"m","stream":false,"messages":[{"role":"user","content":"probe"}]}`

	// round opens the streams against target(i), then measures the
	// probes against probe while all of them are open.
	round := func(target func(i int) string, probe string) []time.Duration {
		relMu.Lock()
		release = make(chan struct{})
		relMu.Unlock()
		open.Store(0)
		var firsts, wg sync.WaitGroup
		firsts.Add(streams)
		for i := range streams {
			wg.Go(func() {
				resp, err := client.Post(target(i)+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
				if err != nil {
					firsts.Done()
					b.Error(err)
					return
				}
				br := bufio.NewReader(resp.Body)
				br.ReadString('\n')
				firsts.Done()
				io.Copy(io.Discard, br)
				resp.Body.Close()
			})
		}
		firsts.Wait()
		if got := open.Load(); got != streams {
			b.Fatalf("%d streams open at the workers, want %d", got, streams)
		}
		lat := make([]time.Duration, 0, probes)
		for range probes {
			t0 := time.Now()
			resp, err := probeClient.Post(probe+"/v1/chat/completions", "application/json", strings.NewReader(probeBody))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("probe status %d", resp.StatusCode)
			}
			lat = append(lat, time.Since(t0))
		}
		relMu.Lock()
		close(release)
		relMu.Unlock()
		wg.Wait()
		return lat
	}
	var ng *nginx
	if nginxPath != "" {
		ng = startNginx(b, nginxPath, urls)
		// Before the workers' deferred Close, which would wait for
		// nginx's keep-alive connections to them forever.
		defer ng.stop()
	}
	var direct, via, viaBare, viaNginx []time.Duration
	var cpuDirect, cpuVia, cpuBare, cpuNginx time.Duration
	rounds := 0
	for b.Loop() {
		c0 := cpuTime()
		direct = append(direct, round(func(i int) string { return urls[i%workers] }, urls[0])...)
		c1 := cpuTime()
		via = append(via, round(func(int) string { return router.URL }, router.URL)...)
		c2 := cpuTime()
		viaBare = append(viaBare, round(func(int) string { return bare.URL }, bare.URL)...)
		c3 := cpuTime()
		cpuDirect += c1 - c0
		cpuVia += c2 - c1
		cpuBare += c3 - c2
		if ng != nil {
			n0 := ng.cpu(b)
			viaNginx = append(viaNginx, round(func(int) string { return ng.url }, ng.url)...)
			cpuNginx += ng.cpu(b) - n0
		}
		rounds++
	}
	perReq := func(d time.Duration) float64 {
		return float64(d.Nanoseconds()) / 1000 / float64(rounds*(streams+probes))
	}
	b.ReportMetric(perReq(cpuVia-cpuDirect), "cpu-µs/req")
	b.ReportMetric(perReq(cpuBare-cpuDirect), "httputil-cpu-µs/req")
	b.ReportMetric(float64(pct(viaBare, 0.99).Microseconds()), "httputil-p99-µs")
	if ng != nil {
		b.ReportMetric(perReq(cpuNginx), "nginx-cpu-µs/req")
		b.ReportMetric(float64(pct(viaNginx, 0.5).Microseconds()), "nginx-p50-µs")
		b.ReportMetric(float64(pct(viaNginx, 0.99).Microseconds()), "nginx-p99-µs")
		if cpuNginx > 0 {
			b.ReportMetric(float64(cpuVia-cpuDirect)/float64(cpuNginx), "cpu-ratio")
		}
	}
	b.ReportMetric(float64(pct(direct, 0.5).Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(pct(direct, 0.99).Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(pct(via, 0.5).Microseconds()), "sluice-p50-µs")
	b.ReportMetric(float64(pct(via, 0.99).Microseconds()), "sluice-p99-µs")
	b.ReportMetric(float64((cpuVia-cpuDirect).Microseconds())/float64(rounds*(streams+probes)), "router-cpu-µs/req")
}

// nginx is an nginx process proxying to the soak's workers.
type nginx struct {
	url  string
	pid  int
	stop func() // stops the process and waits for it to exit; idempotent
}

// startNginx starts nginx in front of workers from a generated config on
// a free loopback port and waits until it accepts connections; the
// process is stopped when the benchmark ends.
func startNginx(b *testing.B, path string, workers []string) *nginx {
	dir := b.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nginx binds it next
	var servers strings.Builder
	for _, u := range workers {
		fmt.Fprintf(&servers, "\t\tserver %s;\n", strings.TrimPrefix(u, "http://"))
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_rlimit_nofile 65536;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 16384; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	upstream workers {
		least_conn;
%[2]s		keepalive 2048;
	}
	server {
		listen %[3]s;
		location / {
			proxy_pass http://workers;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
			proxy_request_buffering off;
			proxy_read_timeout 300s;
		}
	}
}
`, dir, servers.String(), addr)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(path, "-p", dir, "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
		})
	}
	b.Cleanup(stop)
	// nginx is another process: its readiness is a port that accepts.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			b.Fatalf("nginx exited: %v\n%s", err, log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("nginx not accepting on %s after 10s", addr)
		}
	}
	return &nginx{url: "http://" + addr, pid: cmd.Process.Pid, stop: stop}
}

// cpu returns the process's user and system CPU time so far, from
// /proc/<pid>/stat (utime and stime, fields 14 and 15, in clock ticks of
// 1/100 s, the USER_HZ of Linux on every common platform).
func (n *nginx) cpu(b *testing.B) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", n.pid, raw)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
