package scheduler

import (
	"fmt"
	"slices"
)

// routeFilter keeps out a worker whose engine does not serve the
// request's route (WorkerSpec.Unserved): it would answer 404 after a
// wasted slot.
type routeFilter struct{}

func (routeFilter) passes(p *pick, v *view) bool { return v.w.servesRoute(p.req.Route) }

func (routeFilter) explain(pr *pickRecord, _ *slot) string {
	return fmt.Sprintf("its engine does not serve %s", pr.req.Route)
}

// servesRoute reports whether w's engine serves route ("" is any route).
func (w *worker) servesRoute(route string) bool {
	return route == "" || !slices.Contains(w.spec.Unserved, route)
}
