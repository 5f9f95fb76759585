package server

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// metrics are the router's Prometheus metrics, in a registry of its own so
// several routers can run in one process (tests) and a removed worker's
// series disappear.
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	queueWait *prometheus.HistogramVec
	ttft      *prometheus.HistogramVec
	e2e       *prometheus.HistogramVec
	tokens    *prometheus.CounterVec
}

// latencyBuckets span 5 ms to about 3 minutes: LLM requests differ by two
// orders of magnitude.
var latencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 16)

func newMetrics(sched func() *scheduler.Scheduler, tracker *stats.Tracker) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total", Help: "Inference requests by worker (empty when never placed), HTTP status and reason.",
		}, []string{"worker", "status", "reason"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_queue_wait_seconds", Help: "Time requests waited in Sluice's admission queue.", Buckets: latencyBuckets,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_ttft_seconds", Help: "Time to first token of streamed requests, as the router saw it.", Buckets: latencyBuckets,
		}, []string{"worker"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_request_duration_seconds", Help: "End-to-end time of requests, queueing included.", Buckets: latencyBuckets,
		}, []string{"worker"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_output_tokens_total", Help: "Output tokens relayed, by worker.",
		}, []string{"worker"}),
	}
	m.reg.MustRegister(m.requests, m.queueWait, m.ttft, m.e2e, m.tokens,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{sched: sched, tracker: tracker})
	return m
}

// observe records one finished request.
func (m *metrics) observe(r proxy.Result) {
	m.requests.WithLabelValues(r.Worker, strconv.Itoa(r.Status), r.Reason).Inc()
	if r.Model != "" && r.Status != 0 {
		m.queueWait.WithLabelValues(r.Model).Observe(r.QueueWait.Seconds())
	}
	if r.Worker == "" {
		return
	}
	if r.TTFT > 0 {
		m.ttft.WithLabelValues(r.Worker).Observe(r.TTFT.Seconds())
	}
	m.e2e.WithLabelValues(r.Worker).Observe(r.E2E.Seconds())
	if r.Tokens > 0 {
		m.tokens.WithLabelValues(r.Worker).Add(float64(r.Tokens))
	}
}

// forget drops a removed worker's series.
func (m *metrics) forget(worker string) {
	l := prometheus.Labels{"worker": worker}
	m.requests.DeletePartialMatch(l)
	m.ttft.DeletePartialMatch(l)
	m.e2e.DeletePartialMatch(l)
	m.tokens.DeletePartialMatch(l)
}

var (
	descActive  = prometheus.NewDesc("sluice_worker_active_requests", "Requests Sluice has in flight on the worker.", []string{"worker"}, nil)
	descLimit   = prometheus.NewDesc("sluice_worker_max_concurrency", "The worker's concurrency limit in force.", []string{"worker"}, nil)
	descHealthy = prometheus.NewDesc("sluice_worker_eligible", "1 if the worker is healthy (or not yet probed) and not draining.", []string{"worker"}, nil)
	descKV      = prometheus.NewDesc("sluice_worker_kv_pressure", "KV-cache use the worker last reported, 0..1.", []string{"worker"}, nil)
	descTTFT    = prometheus.NewDesc("sluice_worker_ema_ttft_ms", "Moving average of the worker's time to first token.", []string{"worker"}, nil)
	descTPS     = prometheus.NewDesc("sluice_worker_ema_decode_tokens_per_second", "Moving average of the worker's per-stream decode rate.", []string{"worker"}, nil)
	descQueue   = prometheus.NewDesc("sluice_queue_depth", "Requests waiting in Sluice's admission queue.", []string{"model"}, nil)
)

// stateCollector reads the scheduler and tracker at scrape time, so its
// series always match the current workers.
type stateCollector struct {
	sched   func() *scheduler.Scheduler
	tracker *stats.Tracker
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActive, descLimit, descHealthy, descKV, descTTFT, descTPS, descQueue} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.sched()
	for _, w := range s.Workers() {
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(w.Active), w.Name)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(w.Limit), w.Name)
		ok := 0.0
		if !w.Draining && (w.Health == scheduler.HealthOK || w.Health == scheduler.HealthUnknown) {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, ok, w.Name)
		if w.Snapshot.KVPressure.Known() {
			ch <- prometheus.MustNewConstMetric(descKV, prometheus.GaugeValue, w.Snapshot.KVPressure.Value, w.Name)
		}
		st := c.tracker.Get(w.Name)
		if st.TTFTMs.Known() {
			ch <- prometheus.MustNewConstMetric(descTTFT, prometheus.GaugeValue, st.TTFTMs.Value, w.Name)
		}
		if st.DecodeTPS.Known() {
			ch <- prometheus.MustNewConstMetric(descTPS, prometheus.GaugeValue, st.DecodeTPS.Value, w.Name)
		}
	}
	// Only models the fleet serves: a queue also exists for every model
	// name a client ever asked for, and a client must not mint series.
	served := s.Models()
	for model, depth := range s.QueueDepths() {
		if slices.Contains(served, model) {
			ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(depth), model)
		}
	}
}
