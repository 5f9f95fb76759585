package scheduler

import "fmt"

// adapterFilter keeps, for a request naming a LoRA adapter, the workers
// that hold it (loaded, or being loaded by Sluice); only when none of the
// workers left with room holds it, the workers that may load it now:
// with adapters.load_on_demand, a worker that loads adapters at run time
// while fewer than max_replicas workers hold this one (adapter.go). So a
// holder with room always wins over a load, a load happens only when
// every holder is full, and an adapter is on at most max_replicas cards;
// when no worker qualifies the request waits for a holder's slot.
//
// It runs after the limit rule, so "holders with room" is what it sees,
// and again after the affinity relaxation, whose borrowed worker must
// hold the adapter too.
type adapterFilter struct{}

func (adapterFilter) keep(p *pick, in []int32, why uint8) []int32 {
	if p.adapter == nil {
		return in
	}
	for _, i := range in {
		if p.views[i].holds {
			return keepIf(p, in, why, func(v *view) bool { return v.holds })
		}
	}
	return keepIf(p, in, why, func(v *view) bool { return v.loadable })
}

func (adapterFilter) explain(pr *pickRecord, sl *slot) string {
	a := pr.adapter // set: a view is dropped by this rule only when the request names an adapter
	switch {
	case sl.loadable:
		return fmt.Sprintf("LoRA adapter %q not loaded; a worker holding it had room", a.spec.Name)
	case !a.configured || !a.onDemand:
		return fmt.Sprintf("LoRA adapter %q not loaded (no load on demand)", a.spec.Name)
	case a.holders >= a.max:
		return fmt.Sprintf("LoRA adapter %q not loaded; already on %d workers (max_replicas %d)", a.spec.Name, a.holders, a.max)
	}
	return fmt.Sprintf("LoRA adapter %q not loaded; the worker cannot load adapters", a.spec.Name)
}
