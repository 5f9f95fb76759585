package scheduler

import (
	"math"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/stats"
)

// Observer receives the measurements of each request answered in full:
// the stats tracker for its averages (which the scheduler reads back
// through Config.Stats). Complete calls it under the scheduler's lock,
// so it must not block: *stats.Tracker folds in memory and persists in
// the background.
type Observer interface {
	Observe(worker string, o stats.Observation, now time.Time)
}

// Complete is the finish sequence of a request whose answer completed,
// the one both the HTTP proxy and the virtual-time simulation follow:
//
//  1. o is filed under the concurrency level it was measured at
//     (MeanConcurrency, which must be read before the slot is given back);
//  2. obs, if not nil, folds o into the worker's stats; this comes before
//     the release because the release places the next queued request, and
//     that pick reads those stats;
//  3. the output estimate learns o.OutputTokens and the lease is released.
//
// All three under one acquisition of the scheduler's lock: the level is
// read, the stats told and the slot given back with nothing in between.
//
// now is the time the observation is filed at (the wall clock, or the
// simulation's). It returns o as filed. A lease already released is not
// released again, but its observation still reaches obs, unless its
// worker has been removed and forgotten since.
func (l *Lease) Complete(o stats.Observation, obs Observer, now time.Time) stats.Observation {
	o, done := l.complete(o, obs, now)
	l.s.finish(done)
	return o
}

// complete is Complete under s.mu, returning the tickets it ended for
// s.finish. The unlock is deferred: a predictor or observer that panics
// leaves the lock free and the lease unreleased, for its owner to
// release (the proxy defers that).
func (l *Lease) complete(o stats.Observation, obs Observer, now time.Time) (stats.Observation, []*Ticket) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	o.Concurrency = l.meanConcurrencyLocked(s.clock.Now())
	if l.w.retired {
		// Released before, on a worker whose life has ended since: what
		// it did would bring back the state forgotten with the worker.
		obs = nil
	} else if p := s.cfg.Predictor; p != nil {
		// Before the stats: the decode drift is measured against levels
		// that do not hold this request yet.
		out := predict.Outcome{PromptTokens: l.found.PromptTokens, CachedTokens: l.found.CachedTokens,
			InFlight: l.found.InFlight, Slots: l.found.Slots, MeanConcurrency: o.Concurrency,
			TTFT: o.TTFT, DecodeTPS: o.DecodeTPS, OutputTokens: o.OutputTokens, At: now}
		if l.Prediction != nil {
			p.Record(l.Worker, *l.Prediction, out)
		}
		p.Observe(l.Worker, out)
	}
	if obs != nil {
		obs.Observe(l.Worker, o, now)
	}
	if o.CachedKnown && l.Decision != nil {
		l.Decision.SetPrefixOutcome(decisions.PrefixOutcome{ExpectedCachedTokens: l.found.CachedTokens, CachedTokens: o.CachedTokens})
	}
	if pc, ok := s.cfg.PrefixIndex.(PrefixCorrector); ok && o.CachedKnown && !l.w.retired && len(l.req.Prefix) > 0 && l.found.PromptTokens > 0 {
		e, f := prefixBlocks(len(l.req.Prefix), l.found.PromptTokens, l.found.CachedTokens, o.CachedTokens)
		pc.Correct(l.req.Model, l.Worker, l.req.Prefix, e, f)
	}
	if !l.released.CompareAndSwap(false, true) {
		return o, nil
	}
	return o, s.endLocked(l, o.OutputTokens, s.clock.Now())
}

// PrefixCorrector is implemented by a PrefixIndex that learns from what a
// worker reports finding cached (*prefix.Index is one): Complete tells it
// how many of the request's blocks it expected the worker to hold and how
// many the worker found, and it corrects what it believes of the worker.
type PrefixCorrector interface {
	Correct(model, worker string, hashes []uint64, expected, found int)
}

// prefixBlocks converts the cached tokens expected and found of a prompt
// of prompt tokens into its blocks of hashes. Expected came from a
// fraction of the blocks, so it converts back exactly; the difference
// counts whole blocks only, a block being prompt/blocks tokens on
// average, so that how an engine rounds a hit (a partial last block, the
// one token it always computes) is no miss.
func prefixBlocks(blocks, prompt, expected, found int) (e, f int) {
	per := float64(blocks) / float64(prompt)
	e = int(math.Round(float64(expected) * per))
	f = e + int(float64(found-expected)*per) // whole blocks, towards zero
	return e, min(max(f, 0), blocks)
}
