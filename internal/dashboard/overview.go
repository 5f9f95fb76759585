package dashboard

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// Page sizes of GET /api/overview: a page of worker cards is bounded so
// that a fleet of hundreds costs the same to watch as a fleet of four.
const (
	defaultPageSize = 24
	maxPageSize     = 200
	// sparkSamples is the length of each card's concurrency sparkline.
	sparkSamples = 120
	// defaultDecisions and maxDecisions bound the decision list.
	defaultDecisions = 40
	maxDecisions     = 200
	// chartWorkers is how many of the busiest workers the concurrency
	// chart draws.
	chartWorkers = 8
)

// Overview is the answer of GET /api/overview: the fleet now, one page of
// workers, and the samples the page does not have yet.
type Overview struct {
	// Now is the server's time in Unix milliseconds.
	Now int64 `json:"now"`
	// IntervalMs is the sampling interval; LatencyWindowS the trailing
	// window of the latency percentiles.
	IntervalMs     int64   `json:"interval_ms"`
	LatencyWindowS float64 `json:"latency_window_s"`
	// Window is how many samples the ring keeps.
	Window int `json:"window"`
	// Seq is the newest sample's number; pass it back as since.
	Seq int64 `json:"seq"`
	// Samples are those after since, oldest first.
	Samples []Sample `json:"samples"`
	// Fleet counts the workers by state and sums their load.
	Fleet FleetSummary `json:"fleet"`
	// Queues is each model's queue depth in Sluice.
	Queues map[string]int `json:"queues"`
	// Totals are the request outcomes since the router started.
	Totals counters `json:"totals"`
	// Page says which workers follow: Total matched the filter, Workers
	// holds Offset..Offset+len(Workers).
	Page    Page             `json:"page"`
	Workers []map[string]any `json:"workers"`
	// Busiest are the workers with the most requests in flight now, with
	// their concurrency over the whole ring, for the concurrency chart.
	Busiest []WorkerSeries `json:"busiest"`
	// Decisions are the newest decisions, newest first, a line each.
	Decisions []DecisionLine `json:"decisions"`
}

// DecisionLine is one decision in the list: what happened, not why (the
// why is at /debug/decisions/{id}). TTFTMs and WorkerTTFTMs are its
// request's time to first token as the client saw it and the worker's
// share, once it has one (decisions.FirstToken).
type DecisionLine struct {
	ID           string    `json:"id"`
	Time         time.Time `json:"time"`
	Model        string    `json:"model"`
	Outcome      string    `json:"outcome"`
	Chosen       string    `json:"chosen,omitempty"`
	Attempt      int       `json:"attempt"`
	QueueWaitMs  float64   `json:"queue_wait_ms"`
	TTFTMs       float64   `json:"ttft_ms,omitempty"`
	WorkerTTFTMs float64   `json:"worker_ttft_ms,omitempty"`
}

// FleetSummary counts workers by health and sums their load.
type FleetSummary struct {
	Workers  int            `json:"workers"`
	Health   map[string]int `json:"health"`
	Draining int            `json:"draining"`
	Active   int            `json:"active"`
	Limit    int            `json:"limit"`
	Queued   int            `json:"queued"`
}

// Page is the part of the worker list an overview holds.
type Page struct {
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
	Total  int    `json:"total"`
	Sort   string `json:"sort"`
	Query  string `json:"q,omitempty"`
}

// WorkerSeries is one worker's active requests per sample, oldest first,
// -1 before the worker was added.
type WorkerSeries struct {
	Name   string  `json:"name"`
	Limit  int     `json:"limit"`
	Active []int32 `json:"active"`
}

// sorts are the orders the worker cards can be listed in.
var sorts = map[string]func(a, b *workerRow) int{
	// config: the order of the configuration.
	"config": func(a, b *workerRow) int { return cmp.Compare(a.idx, b.idx) },
	"name":   func(a, b *workerRow) int { return strings.Compare(a.ws.Name, b.ws.Name) },
	// busy: most requests in flight (relative to the limit) first.
	"busy": func(a, b *workerRow) int {
		return cmp.Or(cmp.Compare(b.load(), a.load()), cmp.Compare(inFlight(&b.ws), inFlight(&a.ws)), cmp.Compare(a.idx, b.idx))
	},
	// score: best (lowest) latest score first; never scored last.
	"score": func(a, b *workerRow) int {
		as, bs := a.ws.LastTerms != nil && a.ws.LastTerms.Eligible, b.ws.LastTerms != nil && b.ws.LastTerms.Eligible
		if as != bs {
			if as {
				return -1
			}
			return 1
		}
		if as {
			if c := cmp.Compare(a.ws.LastTerms.Total, b.ws.LastTerms.Total); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.idx, b.idx)
	},
	// trouble: down, loading, draining, unknown, then the healthy.
	"trouble": func(a, b *workerRow) int {
		return cmp.Or(cmp.Compare(b.trouble(), a.trouble()), cmp.Compare(a.idx, b.idx))
	},
}

type workerRow struct {
	idx int
	ws  scheduler.WorkerState
}

func (r *workerRow) load() float64 {
	if r.ws.Limit <= 0 {
		return 0
	}
	return float64(inFlight(&r.ws)) / float64(r.ws.Limit)
}

func (r *workerRow) trouble() int {
	switch {
	case r.ws.Health == snapshot.HealthDown:
		return 4
	case r.ws.Health == snapshot.HealthLoading:
		return 3
	case r.ws.Draining:
		return 2
	case r.ws.Health == snapshot.HealthUnknown:
		return 1
	}
	return 0
}

// ServeOverview answers GET /api/overview. Query parameters: since (the
// seq of the newest sample the page has; omitted or 0 for the whole ring),
// offset and limit (the page of workers, limit at most 200), sort (config,
// name, busy, score, trouble), q (keep workers whose name, model or
// health contains it) and decisions (how many of the newest decisions to
// list, at most 200, 40 when omitted).
func (d *Dashboard) ServeOverview(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var bad error // the first parameter that does not parse
	param := func(name string, def, lo, hi int) int {
		n, err := intParam(q.Get(name), def, lo, hi)
		if err != nil && bad == nil {
			bad = fmt.Errorf("%s: %w", name, err)
		}
		return n
	}
	since, offset := param("since", 0, 0, 1<<62), param("offset", 0, 0, 1<<31)
	limit, nDecisions := param("limit", defaultPageSize, 1, maxPageSize), param("decisions", defaultDecisions, 0, maxDecisions)
	if bad != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request", bad.Error())
		return
	}
	sortName := cmp.Or(q.Get("sort"), "config")
	order, ok := sorts[sortName]
	if !ok {
		names := slices.Sorted(maps.Keys(sorts))
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("sort %q: want one of %s", sortName, strings.Join(names, ", ")))
		return
	}
	filter := strings.ToLower(strings.TrimSpace(q.Get("q")))
	ov := d.overview(int64(since), offset, limit, sortName, order, filter)
	ov.Decisions = d.decisionLines(nDecisions)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(ov)
}

func intParam(v string, def, lo, hi int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%q: want an integer from %d to %d", v, lo, hi)
	}
	return n, nil
}

func (d *Dashboard) overview(since int64, offset, limit int, sortName string, order func(a, b *workerRow) int, filter string) Overview {
	now := d.opt.Now()
	all := d.opt.Workers()
	queues := d.opt.QueueDepths()
	if queues == nil {
		queues = map[string]int{}
	}
	ov := Overview{
		Now: now.UnixMilli(), IntervalMs: d.opt.Interval.Milliseconds(), LatencyWindowS: d.opt.LatencyWindow.Seconds(), Window: len(d.ring),
		Queues: queues, Fleet: FleetSummary{Workers: len(all), Health: map[string]int{}},
		Page: Page{Offset: offset, Limit: limit, Sort: sortName, Query: filter},
	}
	for _, n := range queues {
		ov.Fleet.Queued += n
	}
	rows := make([]*workerRow, 0, len(all))
	for i, ws := range all {
		ov.Fleet.Health[ws.Health.String()]++
		if ws.Draining {
			ov.Fleet.Draining++
		}
		ov.Fleet.Active += inFlight(&ws)
		ov.Fleet.Limit += ws.Limit
		if filter == "" || matches(ws, filter) {
			rows = append(rows, &workerRow{idx: i, ws: ws})
		}
	}
	busiest := slices.Clone(rows)
	if filter != "" { // the chart shows the fleet, not the filter
		busiest = busiest[:0]
		for i, ws := range all {
			busiest = append(busiest, &workerRow{idx: i, ws: ws})
		}
	}
	slices.SortStableFunc(busiest, func(a, b *workerRow) int {
		return cmp.Or(cmp.Compare(inFlight(&b.ws), inFlight(&a.ws)), cmp.Compare(a.idx, b.idx))
	})
	busiest = busiest[:min(len(busiest), chartWorkers)]
	slices.SortStableFunc(rows, order)
	ov.Page.Total = len(rows)
	page := rows[min(offset, len(rows)):min(offset+limit, len(rows))]

	d.mu.Lock()
	ov.Seq = d.seq
	ov.Samples = d.samplesAfterLocked(since)
	ov.Totals = d.totals
	sparks := make([][]int32, len(page))
	for i, r := range page {
		sparks[i] = d.activeSeriesLocked(r.ws.Name, sparkSamples)
	}
	for _, r := range busiest {
		ov.Busiest = append(ov.Busiest, WorkerSeries{Name: r.ws.Name, Limit: r.ws.Limit, Active: d.activeSeriesLocked(r.ws.Name, len(d.ring))})
	}
	d.mu.Unlock()

	ov.Workers = make([]map[string]any, 0, len(page))
	for i, r := range page {
		ov.Workers = append(ov.Workers, d.card(r.ws, queues, sparks[i], now))
	}
	return ov
}

func matches(ws scheduler.WorkerState, filter string) bool {
	if strings.Contains(strings.ToLower(ws.Name), filter) || ws.Health.String() == filter || (filter == "draining" && ws.Draining) {
		return true
	}
	for _, m := range ws.Models {
		if strings.Contains(strings.ToLower(m), filter) {
			return true
		}
	}
	return false
}

// card is one worker's card: every top-level field the scheduler reports
// (so fields it gains, such as a learned limit and its reason, reach the
// page without a change here), less the bulky telemetry and breakdown,
// plus compact telemetry, averages, Sluice's queue for its models, its
// latest score and its concurrency sparkline.
func (d *Dashboard) card(ws scheduler.WorkerState, queues map[string]int, spark []int32, now time.Time) map[string]any {
	m := map[string]any{}
	if b, err := json.Marshal(ws); err == nil {
		json.Unmarshal(b, &m)
	}
	delete(m, "telemetry")
	delete(m, "last_terms")
	queued := 0
	for _, model := range ws.Models {
		queued += queues[model]
	}
	m["sluice_queue"] = queued
	if s := ws.Snapshot; s != nil {
		m["slots"] = s.Slots
		m["worker_queue"] = reading(s.QueueLen, now)
		m["kv"] = reading(s.KVPressure, now)
		m["gpu"] = reading(s.GPUUtil, now)
	}
	st := d.opt.Stats(ws.Name)
	avg := map[string]any{}
	for k, e := range map[string]stats.EMA{"ttft_ms": st.TTFTMs, "decode_tps": st.DecodeTPS, "e2e_ms": st.E2EMs, "output_tokens": st.OutputTokens} {
		if e.Known() {
			avg[k] = e.Value
		}
	}
	if st.TTFTMs.N > 0 || st.E2EMs.N > 0 {
		avg["n"] = max(st.TTFTMs.N, st.E2EMs.N)
	}
	m["averages"] = avg
	if c := ws.LastTerms; c != nil {
		m["score"] = score(c, ws.LastScoredAt, now)
	}
	m["spark"] = spark
	return m
}

func reading(r snapshot.Reading, now time.Time) map[string]any {
	if !r.Known() {
		return nil
	}
	return map[string]any{"value": r.Value, "source": r.Source, "age_ms": now.Sub(r.At).Milliseconds()}
}

// score is a worker's part in its latest decision, compact.
func score(c *decisions.Candidate, at time.Time, now time.Time) map[string]any {
	terms := make([]map[string]any, 0, len(c.Terms))
	for _, t := range c.Terms {
		tm := map[string]any{"name": t.Name, "raw": t.Raw, "norm": t.Norm, "weight": t.Weight, "weighted": t.Weighted}
		if t.Source != "" {
			tm["source"] = t.Source
		}
		if t.Stale {
			tm["stale"] = true
		}
		if t.Neutral {
			tm["neutral"] = true
		}
		terms = append(terms, tm)
	}
	out := map[string]any{"total": c.Total, "eligible": c.Eligible, "terms": terms}
	if c.Rank > 0 {
		out["rank"] = c.Rank
	}
	if c.Why != "" {
		out["why"] = c.Why
	}
	if !at.IsZero() {
		out["age_ms"] = now.Sub(at).Milliseconds()
	}
	return out
}

// decisionLines lists the newest n decisions. It reads only fields that
// are set before a record is logged, and its first token through the
// record's atomic accessor, never the breakdown that Explain may be
// filling in on another goroutine.
func (d *Dashboard) decisionLines(n int) []DecisionLine {
	out := []DecisionLine{}
	if d.opt.Recent == nil || n == 0 {
		return out
	}
	for _, r := range d.opt.Recent(n) {
		ft, _ := r.FirstToken()
		out = append(out, DecisionLine{ID: r.ID, Time: r.Time, Model: r.Model, Outcome: r.Outcome,
			Chosen: r.Chosen, Attempt: r.Attempt, QueueWaitMs: r.QueueWaitMs, TTFTMs: ft.TTFTMs, WorkerTTFTMs: ft.WorkerTTFTMs})
	}
	return out
}
