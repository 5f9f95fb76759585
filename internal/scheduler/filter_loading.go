package scheduler

import (
	"fmt"
	"slices"
)

// loadingFilter keeps a worker out while the requested model is loading
// there: the whole worker (llama.cpp's /health answers 503 while its one
// model loads: Snapshot.Health is HealthLoading), or just this model on a
// worker that serves several and reports which it is loading
// (Snapshot.LoadingModels), where its other models are still served. A
// request sent to a model still loading waits inside the worker for as
// long as the load takes, seconds to minutes, while another card may be
// free; in Sluice's queue it is bound to whichever frees first, and
// waiting is never refused as pointless for it (admissibleLocked counts a
// loading worker as capacity on its way).
type loadingFilter struct{}

func (f loadingFilter) keep(p *pick, in []int32, why uint8) []int32 {
	return keepRule(p, in, why, f)
}
func (loadingFilter) passes(p *pick, v *view) bool { return !loading(v.snap, p.req.Model) }

func (loadingFilter) explain(pr *pickRecord, sl *slot) string {
	if sl.snap.Health == HealthLoading {
		return "loading model"
	}
	return fmt.Sprintf("loading model %q", pr.req.Model)
}

// loading reports whether model is loading on the worker whose snapshot
// is snap.
func loading(snap *Snapshot, model string) bool {
	return snap.Health == HealthLoading || (len(snap.LoadingModels) > 0 && slices.Contains(snap.LoadingModels, model))
}
