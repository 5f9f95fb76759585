package vsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/server"
	"github.com/sluice-router/sluice/internal/shared"
)

// HTTPStats is what RunHTTPStats saw of the routers, besides the
// per-request results: the invariants a run with several replicas must
// keep, and who decided what.
type HTTPStats struct {
	// PeakInFlight is, per worker, the most inference requests the
	// routers together had open on it at once, counted where they send to
	// it (from the request until its answer is closed, which is inside
	// the router's reservation): what the worker's limit bounds across
	// replicas.
	PeakInFlight map[string]int
	// Workers are the first router's worker states at the end of the run
	// (limit in force, learned limit, cap and why).
	Workers []scheduler.WorkerState
	// Replicas describes each router, in order; one entry, named "", when
	// the router ran alone.
	Replicas []ReplicaStats
	// LeftInFlight is the shared ledger's in-flight count summed over the
	// workers once every router has shut down: 0 when every reservation
	// made was released. 0 with one router, which has no ledger.
	LeftInFlight int
	// KeyPrefix is the run's Redis key prefix; "" with one router.
	KeyPrefix string
	// ExpectedCached sums, over the first router's bound decisions, the
	// prompt tokens it expected the chosen worker to hold (each record's
	// promise.expected_cached_tokens): set against the engines' own count
	// in the results, how right its prefix index was.
	ExpectedCached int64
	// KVDecisions counts, with HTTPConfig.KVEvents, the bound decisions
	// whose chosen worker's prefix term read the exact index of KV events
	// rather than the guess; KV is each worker's index at the end.
	KVDecisions int
	KV          []KVState
}

// ReplicaStats is one router's part in a run, from its decision records.
type ReplicaStats struct {
	// Name is the replica's name ("r1", "r2", ...).
	Name string
	// Sent counts the requests the front sent it; with one router, every
	// request.
	Sent int
	// Bound and Refused count its records that placed a request on a
	// worker (retries included) and that refused one.
	Bound, Refused int
	// Misnamed counts its records that do not name it as the replica that
	// decided: 0 when the records are right.
	Misnamed int
	// Degraded counts its records made on its local view because the
	// shared state was unavailable.
	Degraded int
	// MaxStateAgeMs is the oldest shared state any of its decisions used
	// (how long before the decision Redis last answered).
	MaxStateAgeMs float64
}

// routers are the router replicas of one HTTP run and the front that
// spreads the load over them.
type routers struct {
	target string // where the load generator sends
	names  []string
	urls   []string // the replicas' base URLs
	srvs   []*server.Server
	serves []func() // stop serving and wait for the handlers
	trs    []*http.Transport
	front  *front
	frontS *http.Server
	rdb    *redis.Client // the replicas' Redis, for the checks and cleanup
	prefix string
	kv     bool // the routers follow the workers' KV events

	once sync.Once
	st   HTTPStats
	err  error
}

// startRouters starts max(1, hc.Replicas) routers configured by rc (each
// replica sharing the ledger and the stats store on hc.Redis under a key
// prefix of its own run) and, for several, the round-robin front. On
// error the routers started so far are in the returned value, for stop.
func startRouters(ctx context.Context, rc config.Config, hc HTTPConfig, peaks *peakCounter, log *slog.Logger) (*routers, error) {
	n := max(1, hc.Replicas)
	rs := &routers{kv: hc.KVEvents}
	sharedURL := ""
	if n > 1 {
		var b [6]byte
		_, _ = rand.Read(b[:])
		rs.prefix = "sluice-bench-" + hex.EncodeToString(b[:]) + ":"
		var err error
		if rs.rdb, _, err = redisconn.Open(hc.Redis, rs.prefix); err != nil {
			return rs, fmt.Errorf("vsim: http: replicas' Redis: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = rs.rdb.Ping(pctx).Err()
		cancel()
		if err != nil {
			return rs, fmt.Errorf("vsim: http: replicas' Redis at %s does not answer: %w", redisconn.Redact(hc.Redis), err)
		}
		if sharedURL, err = withPrefix(hc.Redis, rs.prefix); err != nil {
			return rs, err
		}
	}
	for i := range n {
		cfg := rc
		name := ""
		if n > 1 {
			name = fmt.Sprintf("r%d", i+1)
			cfg.Stats.Store, cfg.Stats.RedisPrefix = sharedURL, ""
			cfg.Shared = config.Shared{Redis: sharedURL, Replica: name, LeaseTTL: rc.Shared.LeaseTTL, Replicas: n}
		}
		if err := cfg.Validate(); err != nil {
			return rs, fmt.Errorf("vsim: http: router config: %w", err)
		}
		tr := &http.Transport{MaxIdleConns: 0, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}
		rs.trs = append(rs.trs, tr)
		rlog := log
		if name != "" {
			rlog = log.With("replica", name)
		}
		srv, err := server.New(cfg, server.Options{Logger: rlog, Transport: peaks.wrap(tr)})
		if err != nil {
			return rs, fmt.Errorf("vsim: http: router %s: %w", name, err)
		}
		rs.srvs, rs.names = append(rs.srvs, srv), append(rs.names, name)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return rs, fmt.Errorf("vsim: http: listen: %w", err)
		}
		serveCtx, stopServe := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(serveCtx, ln, time.Second) }()
		rs.serves = append(rs.serves, func() { stopServe(); <-served })
		rs.target = "http://" + ln.Addr().String()
		rs.urls = append(rs.urls, rs.target)
		if err := waitHealthy(ctx, srv.Scheduler(), rc.Workers); err != nil {
			return rs, err
		}
	}
	if n == 1 {
		return rs, nil
	}
	f, err := newFront(rs.urls)
	if err != nil {
		return rs, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rs, fmt.Errorf("vsim: http: listen: %w", err)
	}
	rs.front = f
	rs.frontS = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second, ErrorLog: stdlog.New(io.Discard, "", 0)}
	go func() { _ = rs.frontS.Serve(ln) }()
	rs.target = "http://" + ln.Addr().String()
	return rs, nil
}

// withPrefix returns the Redis URL raw with Sluice's prefix parameter set.
func withPrefix(raw, prefix string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("vsim: http: Redis URL: %w", err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// finish shuts the routers down and returns what they did.
func (rs *routers) finish(peaks *peakCounter) (HTTPStats, error) {
	rs.shutdown(peaks)
	return rs.st, rs.err
}

// stop shuts everything down; after finish it does nothing.
func (rs *routers) stop() { rs.shutdown(nil) }

// shutdown stops the front and every router (waiting for their handlers,
// so every reservation is released), reads their decision records,
// closes them (the last stats flush), checks that the shared ledger holds
// nothing more and deletes the run's keys. It runs once.
func (rs *routers) shutdown(peaks *peakCounter) {
	rs.once.Do(func() {
		if rs.frontS != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = rs.frontS.Shutdown(sctx)
			cancel()
		}
		for _, stop := range rs.serves {
			stop()
		}
		if peaks != nil && len(rs.srvs) > 0 {
			rs.st = rs.collect(peaks)
		}
		var workers []string
		if len(rs.srvs) > 0 {
			for _, w := range rs.srvs[0].Scheduler().Workers() {
				workers = append(workers, w.Name)
			}
		}
		for _, s := range rs.srvs {
			_ = s.Close()
		}
		if rs.front != nil {
			rs.front.tr.CloseIdleConnections()
		}
		for _, tr := range rs.trs {
			tr.CloseIdleConnections()
		}
		if rs.rdb == nil {
			return
		}
		defer rs.rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if peaks != nil && len(workers) > 0 {
			if left, err := leftInFlight(ctx, rs.rdb, rs.prefix, workers); err != nil {
				rs.err = err
			} else {
				rs.st.LeftInFlight = left
			}
		}
		if err := deletePrefix(ctx, rs.rdb, rs.prefix); err != nil && rs.err == nil {
			rs.err = err
		}
	})
}

// collect reads the routers' decision records and the peaks.
func (rs *routers) collect(peaks *peakCounter) HTTPStats {
	st := HTTPStats{PeakInFlight: peaks.peaks(), Workers: rs.srvs[0].Scheduler().Workers(), KeyPrefix: rs.prefix}
	for i, s := range rs.srvs {
		r := ReplicaStats{Name: rs.names[i]}
		if rs.front != nil {
			r.Sent = int(rs.front.sent[i].Load())
		}
		recs := s.Decisions().Recent(0)
		for _, rec := range recs {
			if i == 0 && rec.Chosen != "" && rec.Promise != nil {
				st.ExpectedCached += int64(rec.Promise.ExpectedCachedTokens)
			}
			if rec.Chosen != "" {
				r.Bound++
			} else {
				r.Refused++
			}
			if rec.Replica != r.Name {
				r.Misnamed++
			}
			if rec.Degraded {
				r.Degraded++
			}
			r.MaxStateAgeMs = max(r.MaxStateAgeMs, rec.SharedStateAgeMs)
		}
		st.Replicas = append(st.Replicas, r)
		if i == 0 && rs.kv {
			collectKV(&st, s, recs)
		}
	}
	return st
}

// leftInFlight sums the ledger's in-flight counts of workers.
func leftInFlight(ctx context.Context, rdb *redis.Client, prefix string, workers []string) (int, error) {
	l, err := shared.New(shared.Config{Client: rdb, Prefix: prefix, Replica: "bench-check"})
	if err != nil {
		return 0, err
	}
	counts, err := l.InFlight(ctx, workers...)
	if err != nil {
		return 0, fmt.Errorf("vsim: http: read the shared ledger: %w", err)
	}
	sum := 0
	for _, c := range counts {
		sum += c
	}
	return sum, nil
}

// deletePrefix deletes every key under prefix (which holds no glob
// characters: the run made it).
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+"*", 256).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("vsim: http: list the run's Redis keys: %w", err)
	}
	for len(keys) > 0 {
		n := min(len(keys), 256)
		if err := rdb.Del(ctx, keys[:n]...).Err(); err != nil {
			return fmt.Errorf("vsim: http: delete the run's Redis keys: %w", err)
		}
		keys = keys[n:]
	}
	return nil
}

// front is the load balancer in front of the replicas: request i (in the
// order the front receives them) goes to replica i mod n, so a run
// spreads its load the same way every time.
type front struct {
	next    atomic.Uint64
	proxies []*httputil.ReverseProxy
	sent    []atomic.Int64
	tr      *http.Transport
}

func newFront(targets []string) (*front, error) {
	f := &front{sent: make([]atomic.Int64, len(targets)),
		tr: &http.Transport{MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}}
	for _, t := range targets {
		u, err := url.Parse(t)
		if err != nil {
			return nil, fmt.Errorf("vsim: http: front: %w", err)
		}
		f.proxies = append(f.proxies, &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
			Transport:     f.tr,
			FlushInterval: -1, // relay every SSE event at once
			ErrorLog:      stdlog.New(io.Discard, "", 0),
		})
	}
	return f, nil
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := (f.next.Add(1) - 1) % uint64(len(f.proxies))
	f.sent[i].Add(1)
	f.proxies[i].ServeHTTP(w, r)
}

// peakCounter counts the inference requests the routers have open on each
// worker, across routers, and keeps the most at once.
type peakCounter struct {
	byHost map[string]string // worker's host:port -> name
	mu     sync.Mutex
	open   map[string]int
	peak   map[string]int
}

func newPeakCounter(ws []config.Worker) *peakCounter {
	p := &peakCounter{byHost: map[string]string{}, open: map[string]int{}, peak: map[string]int{}}
	for _, w := range ws {
		if u, err := url.Parse(w.URL); err == nil {
			p.byHost[u.Host] = w.Name
			p.peak[w.Name] = 0
		}
	}
	return p
}

func (p *peakCounter) add(worker string, d int) {
	p.mu.Lock()
	p.open[worker] += d
	p.peak[worker] = max(p.peak[worker], p.open[worker])
	p.mu.Unlock()
}

func (p *peakCounter) peaks() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.peak))
	for k, v := range p.peak {
		out[k] = v
	}
	return out
}

// wrap returns a transport counting base's inference requests (POSTs to a
// worker other than /tokenize; probes are GETs).
func (p *peakCounter) wrap(base http.RoundTripper) http.RoundTripper {
	return peakTransport{p: p, base: base}
}

type peakTransport struct {
	p    *peakCounter
	base http.RoundTripper
}

func (t peakTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w, ok := t.p.byHost[r.URL.Host]
	if !ok || r.Method != http.MethodPost || r.URL.Path == "/tokenize" {
		return t.base.RoundTrip(r)
	}
	t.p.add(w, 1)
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		t.p.add(w, -1)
		return nil, err
	}
	resp.Body = &doneBody{ReadCloser: resp.Body, done: func() { t.p.add(w, -1) }}
	return resp, nil
}

// doneBody calls done once, when the body is first closed.
type doneBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *doneBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// discoveredModel is the first model the first router has discovered on
// its first worker, or "".
func (rs *routers) discoveredModel() string {
	if len(rs.srvs) == 0 {
		return ""
	}
	ws := rs.srvs[0].Scheduler().Workers()
	if len(ws) == 0 || ws[0].Snapshot == nil || len(ws[0].Snapshot.Models) == 0 {
		return ""
	}
	return ws[0].Snapshot.Models[0]
}
