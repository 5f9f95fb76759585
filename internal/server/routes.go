package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/proxy"
)

// inferencePaths are the routes the proxy serves; the guard treats them
// as client routes (API key, per-key limits).
var inferencePaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/completion",
	"/v1/responses", "/v1/rerank", "/rerank", "/v1/messages", "/v1/messages/count_tokens"}

// routes registers every route of the router on its mux.
func (s *Server) routes() {
	inference := s.counted(s.proxy)
	for _, p := range inferencePaths {
		s.route(p, inference)
	}
	s.routeFunc("GET /v1/models", s.models)
	s.routeFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.routeFunc("GET /readyz", s.ready)
	s.routeFunc("GET /debug/decisions", s.listDecisions)
	s.routeFunc("GET /debug/decisions/{id}", s.getDecision)
	s.routeFunc("GET /api/workers", s.listWorkers)
	s.routeFunc("POST /api/workers", s.postWorker)
	s.routeFunc("POST /api/workers/{name}/drain", s.drainWithDeadline)
	s.routeFunc("POST /api/workers/{name}/undrain", s.undrainWorker)
	s.routeFunc("DELETE /api/workers/{name}", s.deleteWorker)
	s.route("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{Registry: s.metrics.reg}))
	s.routeFunc("GET /{$}", s.dash.Index)
	s.route("GET /dashboard/", s.dash.Assets())
	s.routeFunc("GET /api/overview", s.dash.ServeOverview)
	s.routeFunc("/", func(w http.ResponseWriter, r *http.Request) {
		proxy.WriteErrorFor(w, r.URL.Path, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
}

// route registers h for pattern and notes the pattern, so that a test
// can hold the route table of docs/api.md to what is served.
func (s *Server) route(pattern string, h http.Handler) {
	s.patterns = append(s.patterns, pattern)
	s.mux.Handle(pattern, h)
}

func (s *Server) routeFunc(pattern string, f http.HandlerFunc) { s.route(pattern, f) }

// counted counts the requests h is serving in s.inFlight, so that a
// shutdown knows when nothing is in flight.
func (s *Server) counted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inFlight.Add(1)
		defer func() {
			if s.inFlight.Add(-1) == 0 {
				select {
				case s.idle <- struct{}{}:
				default:
				}
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// models answers GET /v1/models with the union of models across workers.
// LoRA adapters are listed as vLLM lists them: with parent, their base.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: s.modelList()}
	writeJSON(w, http.StatusOK, out)
}

// ready is 200 when at least one worker could take a request.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.stopping.Load() {
		proxy.WriteError(w, http.StatusServiceUnavailable, "shutting_down", "Sluice is shutting down; take it out of rotation")
		return
	}
	n := 0
	for _, b := range s.sched.Briefs() {
		if b.Eligible() {
			n++
		}
	}
	if n == 0 {
		proxy.WriteError(w, http.StatusServiceUnavailable, "no_healthy_worker", "no worker is healthy")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "eligible_workers": n})
}

func (s *Server) listDecisions(w http.ResponseWriter, r *http.Request) {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			proxy.WriteError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("limit %q: want a positive integer", v))
			return
		}
		limit = n
	}
	writeJSON(w, http.StatusOK, map[string]any{"decisions": s.dlog.Recent(limit)})
}

func (s *Server) getDecision(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec, ok := s.dlog.Get(id)
	if !ok {
		proxy.WriteError(w, http.StatusNotFound, "decision_not_found", fmt.Sprintf("decision %q is not in the ring buffer (it keeps the last %d)", id, s.cfg.Decisions.RingSize))
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

func (s *Server) postWorker(w http.ResponseWriter, r *http.Request) {
	var wc config.Worker
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wc); err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request", "worker JSON: "+err.Error())
		return
	}
	if err := s.AddWorker(wc); err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_worker", err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"added": wc.Name})
}

// undrainWorker is POST /api/workers/{name}/undrain: the worker takes new
// work again, and its pending drain deadline is cancelled.
func (s *Server) undrainWorker(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	s.stopDrains(name)
	if err := s.sched.SetDraining(name, false); err != nil {
		proxy.WriteError(w, http.StatusNotFound, "worker_not_found", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"worker": name, "draining": false})
}

func (s *Server) deleteWorker(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.RemoveWorker(name); err != nil {
		proxy.WriteError(w, http.StatusNotFound, "worker_not_found", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"removed": name})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
