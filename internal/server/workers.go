package server

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-router/sluice/internal/fleet"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// workerSummary is one worker in GET /api/workers: what an operator reads
// of it. Readings are null when the worker never reported them; stale
// names those older than telemetry.stale_after and problems what the last
// probe could not read. The internals are in the detail view.
type workerSummary struct {
	Name          string               `json:"name"`
	URL           string               `json:"url"`
	Kind          string               `json:"kind"`
	Health        snapshot.Health      `json:"health"`
	HealthReason  string               `json:"health_reason,omitempty"`
	Draining      bool                 `json:"draining"`
	Models        []string             `json:"models"`
	Adapters      []lora.State         `json:"adapters,omitempty"`
	Active        int                  `json:"active"`
	OtherReplicas int                  `json:"active_other_replicas,omitempty"`
	Limit         int                  `json:"limit"`
	LimitSource   string               `json:"limit_source"`
	LimitReason   string               `json:"limit_reason"`
	LimitCap      int                  `json:"limit_cap"`
	LimitMoved    *scheduler.LimitMove `json:"limit_moved,omitempty"`
	// Queued is the requests for the worker's models waiting in Sluice's
	// queue; WorkerQueue those waiting inside the worker itself.
	Queued      int      `json:"queued"`
	WorkerQueue *float64 `json:"worker_queue"`
	KVPressure  *float64 `json:"kv_pressure"`
	GPUUtil     *float64 `json:"gpu_util"`
	// PrefixHitRate is the share of prompt tokens the worker found in its
	// own prefix cache lately (vLLM); absent when it does not say.
	PrefixHitRate *float64 `json:"prefix_hit_rate,omitempty"`
	Stale         []string `json:"stale,omitempty"`
	Problems      []string `json:"problems,omitempty"`
	// The moving averages Sluice measured, null before any request, and
	// how many requests they are over.
	TTFTMs    *float64 `json:"ttft_ms"`
	DecodeTPS *float64 `json:"decode_tok_s"`
	E2EMs     *float64 `json:"e2e_ms"`
	Measured  int64    `json:"measured"`
	// LastDecision is the worker's part in the latest decision that
	// scored it.
	LastDecision *lastDecision `json:"last_decision,omitempty"`
	KVEvents     *kvView       `json:"kv_events,omitempty"`
}

// lastDecision is a worker's part in the latest decision that scored it:
// its rank among the eligible (lowest score first) or why it was not
// eligible.
type lastDecision struct {
	AgoMs    int64   `json:"ago_ms"`
	Eligible bool    `json:"eligible"`
	Rank     int     `json:"rank,omitempty"`
	Score    float64 `json:"score"`
	Why      string  `json:"why,omitempty"`
}

// workerView is one worker in GET /api/workers?detail=1: everything the
// scheduler, the stats tracker and the prober hold of it.
type workerView struct {
	scheduler.WorkerState
	URL   string `json:"url"`
	Kind  string `json:"kind"`
	Stats any    `json:"stats"`
	Fleet any    `json:"probe,omitempty"`
	// KVEvents is the worker's index of KV-cache events (seq, blocks, in
	// sync or not, gaps and replays); absent without kv_events.
	KVEvents *kvView `json:"kv_events,omitempty"`
}

// listWorkers is GET /api/workers: a summary per worker, or with
// ?detail=1 everything known of each.
func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	detail := false
	if v := r.URL.Query().Get("detail"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			proxy.WriteError(w, http.StatusBadRequest, "invalid_request", "detail "+strconv.Quote(v)+": want 1 (everything known of each worker) or 0")
			return
		}
		detail = b
	}
	if detail {
		var out []workerView
		for _, ws := range s.sched.Workers() {
			v := workerView{WorkerState: ws, Stats: s.tracker.Get(ws.Name), KVEvents: s.kv.view(ws.Name)}
			if u, ok := s.resolve(ws.Name); ok {
				v.URL = u.String()
			}
			if fw := s.fleet.Get(ws.Name); fw != nil {
				v.Kind = fw.Config().Kind
				v.Fleet = fw.State()
			}
			out = append(out, v)
		}
		writeJSON(w, http.StatusOK, map[string]any{"workers": out})
		return
	}
	queues := s.sched.QueueDepths()
	now := time.Now()
	out := []workerSummary{}
	for _, ws := range s.sched.Workers() {
		out = append(out, s.summary(ws, queues, now))
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": out})
}

func (s *Server) summary(ws scheduler.WorkerState, queues map[string]int, now time.Time) workerSummary {
	v := workerSummary{
		Name: ws.Name, Health: ws.Health, HealthReason: ws.Reason, Draining: ws.Draining, Models: ws.Models, Adapters: ws.Adapters,
		Active: ws.Active, OtherReplicas: ws.OtherReplicas,
		Limit: ws.Limit, LimitSource: ws.LimitSource, LimitReason: ws.LimitReason, LimitCap: ws.Cap, LimitMoved: ws.LimitMoved,
		KVEvents: s.kv.view(ws.Name),
	}
	for _, m := range ws.Models {
		v.Queued += queues[m]
	}
	if u, ok := s.resolve(ws.Name); ok {
		v.URL = u.String()
	}
	if snap := ws.Snapshot; snap != nil {
		v.WorkerQueue, v.KVPressure, v.GPUUtil = value(snap.QueueLen), value(snap.KVPressure), value(snap.GPUUtil)
		v.PrefixHitRate = value(snap.PrefixHitRate)
	}
	if fw := s.fleet.Get(ws.Name); fw != nil {
		v.Kind = fw.Config().Kind
		st := fw.State()
		v.Stale = st.Stale
		v.Problems = probeProblems(st)
	}
	st := s.tracker.Get(ws.Name)
	v.TTFTMs, v.DecodeTPS, v.E2EMs = tenth(st.TTFTMs), tenth(st.DecodeTPS), tenth(st.E2EMs)
	v.Measured = max(st.TTFTMs.N, st.E2EMs.N)
	if c := ws.LastTerms; c != nil {
		v.LastDecision = &lastDecision{Eligible: c.Eligible, Rank: c.Rank, Score: math.Round(c.Total*1000) / 1000, Why: c.Why}
		if !ws.LastScoredAt.IsZero() {
			v.LastDecision.AgoMs = now.Sub(ws.LastScoredAt).Milliseconds()
		}
	}
	return v
}

// tenth is a moving average to a tenth, nil before any measurement: what
// a person reads of a millisecond or a token a second.
func tenth(e stats.EMA) *float64 {
	if !e.Known() {
		return nil
	}
	v := math.Round(e.Value*10) / 10
	return &v
}

// value is a reading's value, nil when it was never read.
func value(r snapshot.Reading) *float64 {
	if !r.Known() {
		return nil
	}
	return &r.Value
}

// probeProblems lists what the prober could not read, each prefixed by
// what it was reading.
func probeProblems(st fleet.State) []string {
	var out []string
	for _, p := range []struct{ what, err string }{
		{"probe", st.LastError}, {"metrics", st.MetricsError}, {"gpu metrics", st.GPUError},
		{"props", st.PropsError}, {"models", st.ModelsError}, {"slots", st.SlotsError},
	} {
		if p.err != "" {
			out = append(out, p.what+": "+p.err)
		}
	}
	return out
}
