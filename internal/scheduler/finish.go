package scheduler

import (
	"math"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/stats"
)

// Observer receives the measurements of each request answered in full
// (*stats.Tracker). Complete calls it under the scheduler's lock, so it
// must not block.
type Observer interface {
	Observe(worker string, o stats.Observation, now time.Time)
}

// Complete ends a request whose answer completed, for the HTTP proxy and
// the simulation alike, under one acquisition of the lock: o is filed at
// the concurrency level it ran at (read before the slot is given back),
// the predictor and obs (if not nil) learn it before the release (whose
// dispatch reads the stats), and the lease is released. now is the time
// the observation is filed at. It returns o as filed. An already released
// lease still reports to obs, unless its worker has been retired.
func (l *Lease) Complete(o stats.Observation, obs Observer, now time.Time) stats.Observation {
	o, done := l.complete(o, obs, now)
	l.s.finish(done)
	return o
}

// complete is Complete under s.mu, returning the tickets it ended. A
// predictor or observer that panics leaves the lease unreleased, for its
// owner to release.
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
// worker reports finding cached (*prefix.Index is one).
type PrefixCorrector interface {
	Correct(model, worker string, hashes []uint64, expected, found int)
}

// prefixBlocks converts the cached tokens expected and found of a prompt
// of prompt tokens into its blocks. The difference counts whole blocks
// only, so how an engine rounds a hit (a partial last block) is no miss.
func prefixBlocks(blocks, prompt, expected, found int) (e, f int) {
	per := float64(blocks) / float64(prompt)
	e = int(math.Round(float64(expected) * per))
	f = e + int(float64(found-expected)*per) // whole blocks, towards zero
	return e, min(max(f, 0), blocks)
}
