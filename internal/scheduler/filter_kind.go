package scheduler

import (
	"fmt"
	"slices"
	"strings"
)

// kindFilter keeps, for a request that names the worker kinds that may
// serve it (Request.Kinds), only workers of those kinds. A stream whose
// worker failed mid-way is continued elsewhere by asking the new worker to
// go on from the text already sent, and how to ask is each engine's own:
// a worker whose engine cannot (or is not known to) continue a message
// must never be chosen for it.
type kindFilter struct{}

func (f kindFilter) keep(p *pick, in []int32, why uint8) []int32 {
	return keepRule(p, in, why, f)
}
func (kindFilter) passes(p *pick, v *view) bool { return kindAllowed(&p.req, v.w) }

func (kindFilter) explain(pr *pickRecord, _ *slot) string {
	return fmt.Sprintf("its kind cannot serve this request (wants %s)", strings.Join(pr.req.Kinds, " or "))
}

// kindAllowed reports whether w's kind may serve req.
func kindAllowed(req *Request, w *worker) bool {
	return len(req.Kinds) == 0 || slices.Contains(req.Kinds, w.spec.Kind)
}
