package scheduler

import (
	"fmt"
	"slices"
)

// routeFilter keeps out a worker whose engine does not serve the
// request's route (Request.Route): an Anthropic Messages request
// (/v1/messages) sent to an engine without that API would come back as a
// 404 from the worker, after a wasted slot and a failed attempt. Which
// engines serve which routes is the caller's knowledge (WorkerSpec.
// Unserved, filled by the server from the worker's kind); the scheduler
// only holds requests to it. When the model's workers all lack the route,
// the request is refused at once with ErrRouteNotServed rather than left
// to wait (admissibleLocked).
type routeFilter struct{}

func (f routeFilter) keep(p *pick, in []int32, why uint8) []int32 {
	return keepRule(p, in, why, f)
}
func (routeFilter) passes(p *pick, v *view) bool { return v.w.servesRoute(p.req.Route) }

func (routeFilter) explain(pr *pickRecord, _ *slot) string {
	return fmt.Sprintf("its engine does not serve %s", pr.req.Route)
}

// servesRoute reports whether w's engine serves route ("" is any route).
func (w *worker) servesRoute(route string) bool {
	return route == "" || !slices.Contains(w.spec.Unserved, route)
}
