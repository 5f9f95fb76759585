package scheduler

import (
	"fmt"
	"slices"
	"strings"
)

// kindFilter keeps, for a request naming the worker kinds that may serve
// it (Request.Kinds), only workers of those kinds: a stream continued on
// another worker goes only to an engine that knows how to continue it.
type kindFilter struct{}

func (kindFilter) passes(p *pick, v *view) bool { return kindAllowed(&p.req, v.w) }

func (kindFilter) explain(pr *pickRecord, _ *slot) string {
	return fmt.Sprintf("its kind cannot serve this request (wants %s)", strings.Join(pr.req.Kinds, " or "))
}

// kindAllowed reports whether w's kind may serve req.
func kindAllowed(req *Request, w *worker) bool {
	return len(req.Kinds) == 0 || slices.Contains(req.Kinds, w.spec.Kind)
}
