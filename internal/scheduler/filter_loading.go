package scheduler

import (
	"fmt"
	"slices"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// loadingFilter keeps a worker out while the requested model is loading
// there: the whole worker (HealthLoading) or just this model
// (Snapshot.LoadingModels). The request waits in Sluice's queue, not
// inside the worker, and waiting is not pointless for it.
type loadingFilter struct{}

func (loadingFilter) passes(p *pick, v *view) bool { return !loading(v.snap, p.req.Model) }

func (loadingFilter) explain(pr *pickRecord, sl *slot) string {
	if sl.snap.Health == snapshot.HealthLoading {
		return "loading model"
	}
	return fmt.Sprintf("loading model %q", pr.req.Model)
}

// loading reports whether model is loading on the worker whose snapshot
// is snap.
func loading(snap *snapshot.Snapshot, model string) bool {
	return snap.Health == snapshot.HealthLoading || (len(snap.LoadingModels) > 0 && slices.Contains(snap.LoadingModels, model))
}
