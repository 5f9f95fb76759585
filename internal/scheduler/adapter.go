package scheduler

import (
	"context"
	"errors"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// LoRA adapters (docs/routing.md, LoRA adapters). A request whose model
// names an adapter runs on a worker that holds it: its telemetry lists it
// (Snapshot.Adapters), or a load Sluice made there succeeded or is
// running. With AdapterConfig.LoadOnDemand a worker that serves the base
// model and loads adapters at run time may be chosen to load it, while
// fewer than MaxReplicas workers hold it (filter_adapter.go).
//
// A load is a network call, never made under the lock: the pick notes a
// lora.Load on the chosen worker, and Lease.Ready makes the call. Leases
// bound there meanwhile wait for the same load, made by whichever is ready
// first. A failed load is forgotten, and Admit places the request again
// elsewhere.

// ErrAdapterLoad: the request's adapter could be loaded on no worker.
var ErrAdapterLoad = errors.New("the LoRA adapter could not be loaded on any worker")

// adapterPick is what a pick knows of the request's adapter: which it is,
// and how many workers hold it.
type adapterPick struct {
	spec     lora.Spec
	holders  int // workers holding it or loading it
	max      int
	onDemand bool
}

// adapterOf returns what the pick must know of model when it names a
// configured adapter; nil otherwise.
func (s *Scheduler) adapterOf(model string) *adapterPick {
	if s.adapters == nil {
		return nil
	}
	if spec, ok := s.adapters[model]; ok {
		return &adapterPick{spec: spec, max: s.cfg.Adapters.Replicas(), onDemand: s.cfg.Adapters.LoadOnDemand && s.cfg.Adapters.Loader != nil}
	}
	return nil
}

// holdsLocked reports whether w holds adapter a, as its telemetry lists
// it or Sluice loaded it there, or is loading it (lora.Holdings.Holds).
func (w *worker) holdsLocked(snap *snapshot.Snapshot, a string) bool {
	return w.adapters.Holds(a, snap.Adapters)
}

// servesAdapterLocked reports whether w could ever run a request for ap,
// so that waiting is not pointless: it holds it, or may load it.
func (w *worker) servesAdapterLocked(snap *snapshot.Snapshot, ap *adapterPick) bool {
	return w.holdsLocked(snap, ap.spec.Name) || (ap.onDemand && w.spec.LoadsAdapters && w.serves(snap, ap.spec.Base))
}

// resolveAdapter marks each view's part for the request's adapter:
// whether its worker holds it, and whether it may load it.
func (p *pick) resolveAdapter() {
	ap := p.adapter
	unknown := false // a worker up whose model list was never read may hold it
	for i := range p.views {
		v := &p.views[i]
		v.holds = v.w.holdsLocked(v.snap, ap.spec.Name)
		if v.holds && !v.w.removed {
			ap.holders++
		}
		if !v.serving {
			v.serving = v.holds || v.w.serves(v.snap, ap.spec.Base)
		}
		if v.snap.Models == nil && v.snap.Health != snapshot.HealthDown && !v.w.removed {
			unknown = true
		}
	}
	// No load while some worker's adapters are unknown: its first scrape
	// may show it held the adapter all along, which would put it on more
	// than max_replicas cards. The request waits for that scrape.
	for i := range p.views {
		v := &p.views[i]
		v.loadable = !v.holds && ap.onDemand && v.w.spec.LoadsAdapters && ap.holders < ap.max && !unknown
	}
}

// bindAdapter gives l, bound to w, the load it waits for when w does not
// yet hold the request's adapter ap (nil: none): the one running there, or
// a new one made at Lease.Ready. It returns the adapter's state for the
// record.
func (w *worker) bindAdapter(l *Lease, ap *adapterPick) string {
	if ap == nil {
		return ""
	}
	if ld := w.adapters.Loading(ap.spec.Name); ld != nil {
		l.load = ld
		return "loading on demand (by an earlier request)"
	}
	if w.holdsLocked(w.snapshot(), ap.spec.Name) {
		return "loaded"
	}
	if !ap.onDemand || !w.spec.LoadsAdapters {
		return "not loaded" // cannot happen: the adapter rule kept it out
	}
	l.load = w.adapters.Start(ap.spec.Name, ap.spec.Base)
	return "loading on demand"
}

// unbindAdapter counts l's release in its load, if it waits for one
// (lora.Holdings.Leave), under the scheduler's lock.
func (l *Lease) unbindAdapter() {
	if l.load != nil {
		l.w.adapters.Leave(l.load)
	}
}

// adapterRecord is the record's account of the request's adapter.
func adapterRecord(ap *adapterPick, state string) *decisions.Adapter {
	return &decisions.Adapter{Name: ap.spec.Name, Base: ap.spec.Base, State: state, Holders: ap.holders, MaxReplicas: ap.max}
}

// Ready makes the lease's worker ready for its request: when the request's
// LoRA adapter is still to be loaded there, it loads it or waits for the
// load already started, outside the scheduler's lock. It returns the
// load's error, after which the caller releases the lease. Admit calls
// it; a caller of Submit must, or release the lease.
func (l *Lease) Ready(ctx context.Context) error {
	ld := l.load
	if ld == nil {
		return nil
	}
	s := l.s
	select {
	case <-ld.Turn():
		// The load serves every request bound there meanwhile: the
		// client that set it off may leave without cancelling it.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Adapters.Timeout())
		err := s.cfg.Adapters.Loader.LoadAdapter(lctx, l.Worker, s.adapters[ld.Name])
		cancel()
		s.loadDone(l.w, ld, err)
		return ld.Error(l.Worker)
	case <-ld.Done():
		return ld.Error(l.Worker)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loadDone ends a load, successful or not, and places the requests
// waiting for a holder.
func (s *Scheduler) loadDone(w *worker, ld *lora.Load, err error) {
	now := s.clock.Now()
	s.update(func() ([]*Ticket, error) {
		w.adapters.Settle(ld, err, now)
		return s.sweepLocked(s.dispatchLocked()), nil
	})
}
