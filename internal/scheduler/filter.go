package scheduler

import (
	"fmt"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// A filter is one eligibility rule of a pick. keep returns the views of
// in (indexes into p.views) that pass, compacted in place, and marks each
// one it drops with why; explain puts the reason in words when a record
// is read. A worker's reason is the first rule that dropped it, in code
// order. A new rule is a type, a code and its entry in filters (and, for
// a rule, in rulesWhy).
type filter interface {
	keep(p *pick, in []int32, why uint8) []int32
	explain(pr *pickRecord, sl *slot) string
}

// A rule is an eligibility rule whose verdict on a view depends on the
// view and the pick alone; every filter from whyDraining through whyFull
// is one, made a filter by ruleFilter.
type rule interface {
	passes(p *pick, v *view) bool
	explain(pr *pickRecord, sl *slot) string
}

// ruleFilter is a rule as a filter.
type ruleFilter struct{ rule }

func (f ruleFilter) keep(p *pick, in []int32, why uint8) []int32 {
	return keepIf(p, in, why, func(v *view) bool { return f.passes(p, v) })
}

// keepRules runs the rules whyDraining through whyFull over in, in one
// visit of each view; it leaves what running each rule's keep in turn
// leaves (TestKeepRules).
func keepRules(p *pick, in []int32) []int32 {
	n := 0
	for _, i := range in {
		v := &p.views[i]
		if why := rulesWhy(p, v); why != whyEligible {
			v.why = why
			continue
		}
		in[n] = i
		n++
	}
	return in[:n]
}

// rulesWhy is the code of the first rule v does not pass, or
// whyEligible; the rules are called by type so each check inlines.
func rulesWhy(p *pick, v *view) uint8 {
	switch {
	case !(drainingFilter{}).passes(p, v):
		return whyDraining
	case !(healthFilter{}).passes(p, v):
		return whyDown
	case !(loadingFilter{}).passes(p, v):
		return whyLoading
	case !(modelFilter{}).passes(p, v):
		return whyModel
	case !(routeFilter{}).passes(p, v):
		return whyRoute
	case !(excludedFilter{}).passes(p, v):
		return whyExcluded
	case !(kindFilter{}).passes(p, v):
		return whyKind
	case !(contextFilter{}).passes(p, v):
		return whyContext
	case !(limitFilter{}).passes(p, v):
		return whyFull
	}
	return whyEligible
}

// Why a worker is or is not eligible: whyEligible, or the code of the
// filter that dropped it (an index into filters).
const (
	whyEligible uint8 = iota
	whyDraining
	whyDown
	whyLoading
	whyModel
	whyRoute
	whyExcluded
	whyKind
	whyContext
	whyFull
	whyAdapter
	whyKVFit
	whySLO
)

// filters are the rules by code.
var filters = [...]filter{
	whyDraining: ruleFilter{drainingFilter{}},
	whyDown:     ruleFilter{healthFilter{}},
	whyLoading:  ruleFilter{loadingFilter{}},
	whyModel:    ruleFilter{modelFilter{}},
	whyRoute:    ruleFilter{routeFilter{}},
	whyExcluded: ruleFilter{excludedFilter{}},
	whyKind:     ruleFilter{kindFilter{}},
	whyContext:  ruleFilter{contextFilter{}},
	whyFull:     ruleFilter{limitFilter{}},
	whyAdapter:  adapterFilter{},
	whyKVFit:    kvFitFilter{},
	whySLO:      sloFilter{},
}

// keepIf is the body of most filters: it keeps the views for which ok
// holds and marks the others with why.
func keepIf(p *pick, in []int32, why uint8, ok func(v *view) bool) []int32 {
	n := 0
	for _, i := range in {
		if v := &p.views[i]; ok(v) {
			in[n] = i
			n++
		} else {
			v.why = why
		}
	}
	return in[:n]
}

// drainingFilter keeps out a worker being drained.
type drainingFilter struct{}

func (drainingFilter) passes(_ *pick, v *view) bool      { return !v.draining }
func (drainingFilter) explain(*pickRecord, *slot) string { return "draining" }

// healthFilter keeps out a worker the fleet judged down (failed probes or
// requests in a row); a worker not yet probed is eligible.
type healthFilter struct{}

func (healthFilter) passes(_ *pick, v *view) bool { return v.snap.Health != snapshot.HealthDown }
func (healthFilter) explain(_ *pickRecord, sl *slot) string {
	return "unhealthy: " + sl.snap.HealthReason
}

// modelFilter keeps the workers that serve the requested model: loaded
// as discovered, else as configured.
type modelFilter struct{}

func (modelFilter) passes(_ *pick, v *view) bool { return v.serving }
func (modelFilter) explain(pr *pickRecord, _ *slot) string {
	return fmt.Sprintf("does not serve model %q", pr.req.Model)
}

// excludedFilter keeps a retry away from the workers it already failed on.
type excludedFilter struct{}

func (excludedFilter) passes(p *pick, v *view) bool { return !excluded(&p.req, v.w) }
func (excludedFilter) explain(*pickRecord, *slot) string {
	return "already failed this request"
}

// contextFilter keeps out a worker whose context is shorter than the
// prompt (tooLong).
type contextFilter struct{}

func (contextFilter) passes(p *pick, v *view) bool { return !tooLong(v.snap, &p.req) }
func (contextFilter) explain(pr *pickRecord, sl *slot) string {
	return fmt.Sprintf("prompt of about %d tokens exceeds its context of %d", pr.req.PromptTokens, sl.snap.ContextTokens)
}

// limitFilter keeps a worker only while Sluice runs fewer requests there
// than its concurrency limit. The baselines have no limit.
type limitFilter struct{}

func (limitFilter) passes(p *pick, v *view) bool { return p.baseline || v.active < v.lim.limit }
func (limitFilter) explain(_ *pickRecord, sl *slot) string {
	return fmt.Sprintf("at max_concurrency (%d/%d)", sl.active, sl.limit)
}
