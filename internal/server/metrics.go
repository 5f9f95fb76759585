package server

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// metrics are the router's Prometheus metrics, in a registry of its own so
// several routers can run in one process (tests) and a removed worker's
// series disappear. The model label only ever holds a model the fleet
// serves (proxy.Result.Model), never a client's made-up name.
type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	queueWait    *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	workerTTFT   *prometheus.HistogramVec
	e2e          *prometheus.HistogramVec
	tpot         *prometheus.HistogramVec
	tokens       *prometheus.CounterVec
	promptTokens *prometheus.CounterVec
	retries      *prometheus.CounterVec
	staleRetries *prometheus.CounterVec
	predError    *prometheus.HistogramVec
	// continuations count streams continued on another worker, and gap
	// the wait each added between the tokens on either side of the break.
	continuations *prometheus.CounterVec
	gap           prometheus.Histogram
}

// predErrorBuckets span relative errors of 1% to 256% (|predicted −
// actual| / actual).
var predErrorBuckets = prometheus.ExponentialBuckets(0.01, 2, 9)

// latencyBuckets span 5 ms to about 3 minutes: LLM requests differ by two
// orders of magnitude.
var latencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 16)

// tpotBuckets span 1 ms to about 2 s per token: from a fast card's decode
// step to a badly overloaded one.
var tpotBuckets = prometheus.ExponentialBuckets(0.001, 2, 12)

func newMetrics(sched *scheduler.Scheduler, tracker *stats.Tracker) *metrics {
	wm := []string{"worker", "model"}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total", Help: "Inference requests by worker (empty when never placed), model (empty when not served), HTTP status and reason.",
		}, []string{"worker", "model", "status", "reason"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_queue_wait_seconds", Help: "Time requests waited in Sluice's admission queue.", Buckets: latencyBuckets,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_ttft_seconds", Help: "Time to first token of streamed requests as the client saw it: from arrival at Sluice to the first token relayed, queueing and failed attempts included.", Buckets: latencyBuckets,
		}, wm),
		workerTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_worker_ttft_seconds", Help: "The worker's share of time to first token of streamed requests: from sending to the worker to its first token, Sluice's queue not included.", Buckets: latencyBuckets,
		}, wm),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_request_duration_seconds", Help: "End-to-end time of requests, queueing included.", Buckets: latencyBuckets,
		}, wm),
		predError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_prediction_error", Help: "Relative error of the predictor, |predicted - actual| / actual, of each streamed request's worker-side time to first token (kind=\"ttft\") and decode rate (kind=\"decode\") on the worker chosen.", Buckets: predErrorBuckets,
		}, []string{"worker", "kind"}),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_time_per_output_token_seconds", Help: "Time per output token after the first, of successful requests whose decode rate is known.", Buckets: tpotBuckets,
		}, wm),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_output_tokens_total", Help: "Output tokens relayed.",
		}, wm),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_prompt_tokens_total", Help: "Prompt tokens of requests placed on a worker: the worker's usage count where it gave one, else Sluice's estimate.",
		}, wm),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_retries_total", Help: "Requests placed again on another worker after a worker failed before answering.",
		}, []string{"model"}),
		staleRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_stale_connection_retries_total", Help: "Requests resent to the same worker on a fresh connection after the pooled one turned out closed by the worker; not counted against its health.",
		}, []string{"worker"}),
		continuations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_continuations_total", Help: "Streams continued on another worker after theirs broke them mid-way, by why (upstream_failed, error_event, stream_idle, drain) and how the continuation ended (ok, failed, no_worker).",
		}, []string{"reason", "outcome"}),
		gap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_continuation_gap_seconds", Help: "Time a continuation added to a stream: from the last token before the break to the first token after it.", Buckets: latencyBuckets,
		}),
	}
	m.reg.MustRegister(m.requests, m.queueWait, m.ttft, m.workerTTFT, m.e2e, m.tpot, m.predError, m.tokens, m.promptTokens, m.retries, m.staleRetries,
		m.continuations, m.gap,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{sched: sched, tracker: tracker})
	return m
}

// observe records one finished request. live, when not nil, says which
// workers are members: a retired worker's series are deleted, and a
// result that ends after that adds none back.
func (m *metrics) observe(r proxy.Result, live func(worker string) bool) {
	known := func(w string) bool { return w == "" || live == nil || live(w) }
	gone := !known(r.Worker) // its series are deleted: only the model's count it
	if !gone {
		m.requests.WithLabelValues(r.Worker, r.Model, strconv.Itoa(r.Status), r.Reason).Inc()
	}
	if r.Model != "" && r.Status != 0 {
		m.queueWait.WithLabelValues(r.Model).Observe(r.QueueWait.Seconds())
	}
	if r.Attempts > 1 {
		m.retries.WithLabelValues(r.Model).Add(float64(r.Attempts - 1))
	}
	for _, w := range r.StaleRetries {
		if known(w) {
			m.staleRetries.WithLabelValues(w).Inc()
		}
	}
	for _, c := range r.Continuations {
		m.continuations.WithLabelValues(c.Reason, c.Outcome).Inc()
		if c.Gap > 0 {
			m.gap.Observe(c.Gap.Seconds())
		}
	}
	if r.Worker == "" || gone {
		return
	}
	if r.TTFT > 0 {
		m.ttft.WithLabelValues(r.Worker, r.Model).Observe(r.TTFT.Seconds())
	}
	if r.WorkerTTFT > 0 {
		m.workerTTFT.WithLabelValues(r.Worker, r.Model).Observe(r.WorkerTTFT.Seconds())
	}
	m.e2e.WithLabelValues(r.Worker, r.Model).Observe(r.E2E.Seconds())
	if r.TPOT > 0 {
		m.tpot.WithLabelValues(r.Worker, r.Model).Observe(r.TPOT.Seconds())
	}
	if r.Status == 200 && r.Decision != nil && r.Decision.Promise != nil && r.Decision.Promise.Known {
		p := r.Decision.Promise
		if r.WorkerTTFT > 0 && p.PredictedTTFTMs > 0 {
			actual := float64(r.WorkerTTFT) / float64(time.Millisecond)
			m.predError.WithLabelValues(r.Worker, "ttft").Observe(math.Abs(p.PredictedTTFTMs-actual) / actual)
		}
		if r.TPOT > 0 && p.PredictedDecode > 0 {
			actual := float64(time.Second) / float64(r.TPOT)
			m.predError.WithLabelValues(r.Worker, "decode").Observe(math.Abs(p.PredictedDecode-actual) / actual)
		}
	}
	if r.Tokens > 0 {
		m.tokens.WithLabelValues(r.Worker, r.Model).Add(float64(r.Tokens))
	}
	if r.PromptTokens > 0 {
		m.promptTokens.WithLabelValues(r.Worker, r.Model).Add(float64(r.PromptTokens))
	}
}

// forget drops a removed worker's series.
func (m *metrics) forget(worker string) {
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.requests, m.ttft, m.workerTTFT, m.e2e, m.tpot, m.tokens, m.promptTokens, m.staleRetries, m.predError,
	} {
		v.DeletePartialMatch(prometheus.Labels{"worker": worker})
	}
}

var (
	descActive  = prometheus.NewDesc("sluice_worker_active_requests", "Requests Sluice has in flight on the worker.", []string{"worker"}, nil)
	descLimit   = prometheus.NewDesc("sluice_worker_max_concurrency", "The worker's concurrency limit in force.", []string{"worker"}, nil)
	descLearned = prometheus.NewDesc("sluice_worker_learned_concurrency", "The concurrency limit adaptive concurrency learned for the worker (before borrowing under a backlog).", []string{"worker"}, nil)
	descCap     = prometheus.NewDesc("sluice_worker_concurrency_cap", "The most the worker's limit may be: max_concurrency, else its reported slots, else 64.", []string{"worker"}, nil)
	descFloor   = prometheus.NewDesc("sluice_worker_min_stream_tokens_per_second", "The per-stream decode-rate floor the worker's limit is learned against (0 until one is known); compare sluice_worker_ema_decode_tokens_per_second.", []string{"worker"}, nil)
	descHealthy = prometheus.NewDesc("sluice_worker_eligible", "1 if the worker is healthy (or not yet probed) and not draining.", []string{"worker"}, nil)
	descKV      = prometheus.NewDesc("sluice_worker_kv_cache_usage_ratio", "KV-cache use the worker last reported, 0..1.", []string{"worker"}, nil)
	descGPU     = prometheus.NewDesc("sluice_worker_gpu_utilization_ratio", "GPU utilisation last read for the worker (DCGM or the engine), 0..1.", []string{"worker"}, nil)
	descTTFT    = prometheus.NewDesc("sluice_worker_ema_ttft_seconds", "Moving average of the worker's share of time to first token (from sending to it; compare sluice_worker_ttft_seconds), which the scheduler's latency term reads.", []string{"worker"}, nil)
	descTPS     = prometheus.NewDesc("sluice_worker_ema_decode_tokens_per_second", "Moving average of the worker's per-stream decode rate.", []string{"worker"}, nil)
	descQueue   = prometheus.NewDesc("sluice_queue_depth", "Requests waiting in Sluice's admission queue.", []string{"model"}, nil)
	descQueueBy = prometheus.NewDesc("sluice_queue_depth_by_class", "Requests waiting in Sluice's admission queue, by priority class.", []string{"model", "class"}, nil)
)

// stateCollector reads the scheduler and tracker at scrape time, so its
// series always match the current workers.
type stateCollector struct {
	sched   *scheduler.Scheduler
	tracker *stats.Tracker
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActive, descLimit, descLearned, descCap, descFloor, descHealthy, descKV, descGPU, descTTFT, descTPS, descQueue, descQueueBy} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.sched
	for _, w := range s.Gauges() {
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(w.Active), w.Name)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(w.Limit), w.Name)
		ch <- prometheus.MustNewConstMetric(descLearned, prometheus.GaugeValue, float64(w.Learned), w.Name)
		ch <- prometheus.MustNewConstMetric(descCap, prometheus.GaugeValue, float64(w.Cap), w.Name)
		ch <- prometheus.MustNewConstMetric(descFloor, prometheus.GaugeValue, w.Floor, w.Name)
		ok := 0.0
		if w.Eligible() {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, ok, w.Name)
		if w.Snapshot.KVPressure.Known() {
			ch <- prometheus.MustNewConstMetric(descKV, prometheus.GaugeValue, w.Snapshot.KVPressure.Value, w.Name)
		}
		if w.Snapshot.GPUUtil.Known() {
			ch <- prometheus.MustNewConstMetric(descGPU, prometheus.GaugeValue, w.Snapshot.GPUUtil.Value, w.Name)
		}
		st := c.tracker.Get(w.Name)
		if st.TTFTMs.Known() {
			ch <- prometheus.MustNewConstMetric(descTTFT, prometheus.GaugeValue, st.TTFTMs.Value/1000, w.Name)
		}
		if st.DecodeTPS.Known() {
			ch <- prometheus.MustNewConstMetric(descTPS, prometheus.GaugeValue, st.DecodeTPS.Value, w.Name)
		}
	}
	// Only models the fleet serves: requests may wait for a model nobody
	// is known to serve yet (while discovery runs), and a client must not
	// mint series.
	served := s.Models()
	for model, depth := range s.QueueDepths() {
		if slices.Contains(served, model) {
			ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(depth), model)
		}
	}
	for model, by := range s.QueueDepthsByClass() {
		if slices.Contains(served, model) {
			for class, depth := range by {
				ch <- prometheus.MustNewConstMetric(descQueueBy, prometheus.GaugeValue, float64(depth), model, class)
			}
		}
	}
}
