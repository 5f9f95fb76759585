// Package dashboard is Sluice's live web dashboard: a page served by the
// router itself at "/" that answers "why did my request go there?" at a
// glance. It shows a card per worker (health, models, active/limit, the
// learned limit and its reason when the scheduler reports one, queues, KV
// pressure, GPU load, averages, and its latest score as a stacked bar of
// term contributions), live charts of the last few minutes (queue depth,
// admissions, 429/503 refusals, TTFT as clients see it beside the workers'
// share, time-per-token percentiles, per-worker concurrency) and the
// decision log with each decision's full breakdown.
//
// The page is plain HTML, CSS and JavaScript embedded in the binary with
// go:embed: nothing is fetched from elsewhere at run time and `go build`
// needs no build step. It polls GET /api/overview once a second (the
// decision list comes with it, a line per decision, so its size does not
// grow with the fleet; a decision's full breakdown is fetched from
// /debug/decisions/{id} when it is opened); the
// Dashboard keeps a bounded ring of one sample per interval so that a page
// opened now still shows the last minutes.
//
// # Concurrency Model
//
// A Dashboard is safe for concurrent use. Observe and Decision are called
// from request goroutines and only add to counters under one mutex; Run
// takes a sample each interval (reading the scheduler through the Source
// functions outside that mutex, then appending under it); the overview
// handler copies what it needs under the mutex and encodes outside it.
// Every buffer is bounded: the sample ring, each worker's concurrency ring
// (dropped when the worker is), and the ring of recent latencies.
package dashboard

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

//go:embed assets
var assets embed.FS

// Options configures a Dashboard.
type Options struct {
	// Workers returns every worker's state (scheduler.Scheduler.Workers).
	Workers func() []scheduler.WorkerState
	// Gauges returns every worker's gauges (scheduler.Scheduler.Gauges),
	// what each sample reads: a sample needs no worker's explanation, and
	// is taken every interval whether or not anyone looks. nil samples
	// no worker.
	Gauges func() []scheduler.WorkerGauges
	// QueueDepths returns each model's queue depth in Sluice
	// (scheduler.Scheduler.QueueDepths).
	QueueDepths func() map[string]int
	// Stats returns a worker's measured averages (stats.Tracker.Get); nil
	// shows none.
	Stats func(worker string) stats.WorkerStats
	// Recent returns the newest n decision records, newest first
	// (decisions.Log.Recent); nil lists none.
	Recent func(n int) []*decisions.Record
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Interval is the time between samples; 1s when 0.
	Interval time.Duration
	// Samples is how many samples the ring keeps; 300 when 0 (five minutes
	// at one a second).
	Samples int
	// LatencyWindow is the trailing window over which each sample's TTFT
	// and time-per-token percentiles are computed; 30s when 0. At a few
	// requests a second a shorter window holds too few for a p99 that is
	// not simply the slowest request.
	LatencyWindow time.Duration
}

// Dashboard serves the page and keeps the recent history it charts.
type Dashboard struct {
	opt Options

	mu      sync.Mutex
	cur     counters           // since the last sample
	totals  counters           // since start
	ring    []Sample           // ring of samples; seq s is at s % len
	seq     int64              // seq of the newest sample; 0 before the first
	actives map[string]*series // per-worker active requests, aligned with ring
	lat     []latency          // ring of recent request latencies
	latNext int
	latN    int
}

// counters are request outcomes counted over an interval or since start.
type counters struct {
	Admitted int64 `json:"admitted"`
	// Held counts the admissions that waited in Sluice's queue first.
	Held      int64 `json:"held"`
	OK        int64 `json:"ok"`
	Rejected  int64 `json:"r429"`
	Unavail   int64 `json:"r503"`
	Failed    int64 `json:"failed"`
	OutTokens int64 `json:"tokens"`
}

// latency is one finished streamed request's timing, in milliseconds:
// ttft as its client saw it (from arrival at Sluice), workerTTFT the
// worker's share (from sending to it), tpot 0 when unknown.
type latency struct {
	at                     time.Time
	ttft, workerTTFT, tpot float64
}

// series is one worker's active-request count per sample.
type series struct {
	first int64   // seq of the first sample that has the worker
	v     []int32 // indexed like Dashboard.ring
}

// inFlight is a worker's requests in flight across every replica: this
// replica's own and, with a shared ledger, the others' as the ledger last
// said. The learned limit bounds that total, so the charts and meters
// compare it with the limit.
func inFlight(w *scheduler.WorkerState) int { return w.Active + w.OtherReplicas }

// Sample is the fleet at one moment plus what happened in the interval
// before it.
type Sample struct {
	// Seq numbers samples from 1; a page asks for those after the last it
	// has.
	Seq int64 `json:"seq"`
	// T is the sample's time in Unix milliseconds.
	T int64 `json:"t"`
	// Queued is the number of requests waiting in Sluice's queues.
	Queued int `json:"queued"`
	// Active and Limit sum the workers' in-flight requests and limits.
	// With replicas sharing a ledger a worker's in-flight count is the
	// total across them (inFlight), as its limit is.
	Active int `json:"active"`
	Limit  int `json:"limit"`
	// Healthy counts workers that are eligible (healthy or not yet
	// probed, and not draining).
	Healthy int `json:"healthy"`
	counters
	// TTFT, WorkerTTFT and TPOT are percentiles (milliseconds) over the
	// trailing latency window of time to first token as clients saw it
	// (from arrival at Sluice, queueing included), of the workers' share
	// of it (from sending to the worker) and of time per output token;
	// nil when no request finished in it.
	TTFT       *Percentiles `json:"ttft_ms,omitempty"`
	WorkerTTFT *Percentiles `json:"worker_ttft_ms,omitempty"`
	TPOT       *Percentiles `json:"tpot_ms,omitempty"`
}

// Percentiles are the 50th, 95th and 99th percentiles of a set of values.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	N   int     `json:"n"`
}

// latencyCap bounds the ring of recent latencies; at more requests per
// latency window than this, percentiles come from the newest ones.
const latencyCap = 8192

// New returns a Dashboard reading the scheduler through opt.
func New(opt Options) *Dashboard {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Interval <= 0 {
		opt.Interval = time.Second
	}
	if opt.Samples <= 0 {
		opt.Samples = 300
	}
	if opt.LatencyWindow <= 0 {
		opt.LatencyWindow = 30 * time.Second
	}
	if opt.Stats == nil {
		opt.Stats = func(string) stats.WorkerStats { return stats.WorkerStats{} }
	}
	if opt.Gauges == nil {
		opt.Gauges = func() []scheduler.WorkerGauges { return nil }
	}
	if opt.QueueDepths == nil {
		opt.QueueDepths = func() map[string]int { return nil }
	}
	return &Dashboard{
		opt:     opt,
		ring:    make([]Sample, opt.Samples),
		actives: map[string]*series{},
		lat:     make([]latency, latencyCap),
	}
}

// Observe counts one finished inference request (the proxy's OnResult).
func (d *Dashboard) Observe(r proxy.Result) {
	var l latency
	if r.TTFT > 0 {
		l = latency{at: d.opt.Now(), ttft: ms(r.TTFT), workerTTFT: ms(r.WorkerTTFT)}
		// TTFT and E2E both run from arrival.
		if gen := r.E2E - r.TTFT; r.Tokens > 1 && gen > 0 {
			l.tpot = ms(gen) / float64(r.Tokens-1)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range []*counters{&d.cur, &d.totals} {
		switch {
		case r.Status >= 200 && r.Status < 300:
			c.OK++
		case r.Status == http.StatusTooManyRequests:
			c.Rejected++
		case r.Status == http.StatusServiceUnavailable:
			c.Unavail++
		case r.Status >= 500 || r.Reason == "upstream_failed":
			c.Failed++
		}
		c.OutTokens += int64(r.Tokens)
	}
	if l.ttft > 0 {
		d.lat[d.latNext] = l
		d.latNext = (d.latNext + 1) % len(d.lat)
		d.latN = min(d.latN+1, len(d.lat))
	}
}

// Decision counts one routing decision (the scheduler's Recorder): every
// binding of a request to a worker is an admission, held when the request
// waited in Sluice's queue for it.
func (d *Dashboard) Decision(r *decisions.Record) {
	if r.Chosen == "" {
		return
	}
	held := int64(0)
	if r.QueueWaitMs > 0 {
		held = 1
	}
	d.mu.Lock()
	d.cur.Admitted++
	d.totals.Admitted++
	d.cur.Held += held
	d.totals.Held += held
	d.mu.Unlock()
}

// Run takes a sample every interval until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.opt.Interval)
	defer t.Stop()
	d.Sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Sample()
		}
	}
}

// Sample records the fleet as it is now and the outcomes counted since the
// previous sample, and returns the new sample.
func (d *Dashboard) Sample() Sample {
	now := d.opt.Now()
	workers := d.opt.Gauges()
	queued := 0
	for _, n := range d.opt.QueueDepths() {
		queued += n
	}
	s := Sample{T: now.UnixMilli(), Queued: queued}
	for i := range workers {
		s.Active += workers[i].Active + workers[i].OtherReplicas
		s.Limit += workers[i].Limit
		if workers[i].Eligible() {
			s.Healthy++
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.counters, d.cur = d.cur, counters{}
	s.TTFT, s.WorkerTTFT, s.TPOT = d.percentilesLocked(now.Add(-d.opt.LatencyWindow))
	d.seq++
	s.Seq = d.seq
	idx := int(d.seq % int64(len(d.ring)))
	d.ring[idx] = s
	seen := make(map[string]bool, len(workers))
	for _, w := range workers {
		seen[w.Name] = true
		sr := d.actives[w.Name]
		if sr == nil {
			sr = &series{first: d.seq, v: make([]int32, len(d.ring))}
			d.actives[w.Name] = sr
		}
		sr.v[idx] = int32(w.Active + w.OtherReplicas)
	}
	for name := range d.actives {
		if !seen[name] {
			delete(d.actives, name)
		}
	}
	return s
}

func (d *Dashboard) percentilesLocked(since time.Time) (ttft, workerTTFT, tpot *Percentiles) {
	var a, w, b []float64
	for i := range d.latN {
		l := d.lat[(d.latNext-1-i+len(d.lat))%len(d.lat)]
		if l.at.Before(since) {
			break // older ones are older still
		}
		a = append(a, l.ttft)
		if l.workerTTFT > 0 {
			w = append(w, l.workerTTFT)
		}
		if l.tpot > 0 {
			b = append(b, l.tpot)
		}
	}
	return percentiles(a), percentiles(w), percentiles(b)
}

// percentiles returns the nearest-rank percentiles of v (which it sorts),
// nil when v is empty.
func percentiles(v []float64) *Percentiles {
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	at := func(p float64) float64 {
		i := int(p*float64(len(v))+0.999999) - 1
		return v[min(max(i, 0), len(v)-1)]
	}
	return &Percentiles{P50: at(0.50), P95: at(0.95), P99: at(0.99), N: len(v)}
}

// samplesAfter returns the samples newer than seq, oldest first (all that
// the ring holds when seq is older than its oldest).
func (d *Dashboard) samplesAfterLocked(seq int64) []Sample {
	oldest := max(1, d.seq-int64(len(d.ring))+1)
	from := max(seq+1, oldest)
	out := make([]Sample, 0, max(0, d.seq-from+1))
	for s := from; s <= d.seq; s++ {
		out = append(out, d.ring[s%int64(len(d.ring))])
	}
	return out
}

// activeSeriesLocked returns a worker's active counts for the last n
// samples, oldest first; -1 where the worker was not there yet.
func (d *Dashboard) activeSeriesLocked(name string, n int) []int32 {
	sr := d.actives[name]
	n = min(n, int(d.seq), len(d.ring))
	out := make([]int32, n)
	for i := range n {
		s := d.seq - int64(n-1-i)
		if sr == nil || s < sr.first {
			out[i] = -1
			continue
		}
		out[i] = sr.v[s%int64(len(d.ring))]
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Index serves the dashboard page (mount at "GET /{$}").
func (d *Dashboard) Index(w http.ResponseWriter, r *http.Request) {
	b, err := assets.ReadFile("assets/index.html")
	if err != nil {
		proxy.WriteError(w, http.StatusInternalServerError, "internal_error", "dashboard asset index.html is missing from the binary")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}

// Assets serves the page's scripts and styles (mount at "GET /dashboard/").
func (d *Dashboard) Assets() http.Handler {
	sub, _ := fs.Sub(assets, "assets") // the directory is embedded
	files := http.StripPrefix("/dashboard/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") || strings.HasSuffix(r.URL.Path, ".html") {
			proxy.WriteError(w, http.StatusNotFound, "not_found", "no dashboard asset "+r.URL.Path)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
