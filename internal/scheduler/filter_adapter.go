package scheduler

import "fmt"

// adapterFilter keeps, for a request naming a LoRA adapter, the workers
// that hold it; only when no worker left holds it, those that may load it
// now (adapter.go). So a load happens only when every holder is full. It
// runs after the limit rule and again after the affinity relaxation.
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
	case !a.onDemand:
		return fmt.Sprintf("LoRA adapter %q not loaded (no load on demand)", a.spec.Name)
	case a.holders >= a.max:
		return fmt.Sprintf("LoRA adapter %q not loaded; already on %d workers (max_replicas %d)", a.spec.Name, a.holders, a.max)
	}
	return fmt.Sprintf("LoRA adapter %q not loaded; the worker cannot load adapters", a.spec.Name)
}
