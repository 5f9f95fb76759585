package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-router/sluice/internal/proxy"
)

// A drain with a deadline stops new work to a worker at once and, at the
// deadline, moves the streams it still writes to other workers (the
// proxy's continuation, reason "drain") instead of cutting them or waiting
// for them forever. POST /api/workers/{name}/drain?deadline=30s starts
// one; a worker removed from the fleet gets one of proxy.drain_deadline.
// Streams that cannot be continued are left to finish.

// drainAt moves the streams on worker elsewhere after d (s.after, which
// tests steer), replacing a pending deadline of the worker; the deadline
// is its member's (member.go), and goes with it.
func (s *Server) drainAt(worker string, d time.Duration) {
	s.setDrain(worker, s.proxy.DrainAfter(worker, s.after(d)))
}

// drainWithDeadline is POST /api/workers/{name}/drain: without a deadline
// the worker's streams finish where they are; with ?deadline=<duration>
// the ones still running then are continued on other workers.
func (s *Server) drainWithDeadline(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var d time.Duration
	if v := r.URL.Query().Get("deadline"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			proxy.WriteError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("deadline %q: want a positive duration such as 30s", v))
			return
		}
	}
	if err := s.sched.SetDraining(name, true); err != nil {
		proxy.WriteError(w, http.StatusNotFound, "worker_not_found", err.Error())
		return
	}
	out := map[string]any{"worker": name, "draining": true}
	if d > 0 {
		s.drainAt(name, d)
		out["deadline"] = d.String()
	}
	writeJSON(w, http.StatusOK, out)
}

// fileContinuations puts each continuation of a request on the record of
// the decision that placed it.
func (s *Server) fileContinuations(r proxy.Result) {
	for _, c := range r.Continuations {
		if c.Decision != nil {
			s.dlog.AddContinuation(c.Decision, c.DecisionContinuation())
		}
	}
}
