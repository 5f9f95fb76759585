package scheduler

import "time"

// PrefixIndex tells where a request's prompt prefix is expected to be in a
// worker's KV cache. *prefix.Index is one: the router's own record of which
// worker served which block hashes.
type PrefixIndex interface {
	// Match returns the fraction (0..1) of hashes, counted from the
	// first, that worker is expected to hold for model.
	Match(model string, hashes []uint64, worker string) float64
	// Record notes that worker now serves hashes for model.
	Record(model string, hashes []uint64, worker string)
}

// prefixSourceIndex names where PrefixMatch came from when the router's
// index supplied it: a guess from where earlier requests went, not the
// worker's own report of its cache.
const prefixSourceIndex = "router index (guess)"

// prefixSourceShared is prefixSourceIndex when some of the matched blocks
// were recorded by another replica (the index is shared through Redis).
const prefixSourceShared = "router index (shared)"

// prefixSourcer is a PrefixIndex that also tells whether a match came from
// another replica's records (*prefix.Index and *prefixshare.Index are).
type prefixSourcer interface {
	MatchSource(model string, hashes []uint64, worker string) (float64, bool)
}

// prefixMatchLocked fills c's prefix match for req: how much of req's
// prompt prefix c's worker is expected to hold.
func (s *Scheduler) prefixMatchLocked(req Request, c *Candidate) {
	if s.cfg.PrefixIndex == nil || len(req.Prefix) == 0 || s.cfg.Policy != PolicySluice {
		return // the baselines do not score
	}
	if ms, ok := s.cfg.PrefixIndex.(prefixSourcer); ok {
		var remote bool
		c.PrefixMatch, remote = ms.MatchSource(req.Model, req.Prefix, c.Name)
		c.PrefixSource = prefixSourceIndex
		if remote {
			c.PrefixSource = prefixSourceShared
		}
		return
	}
	c.PrefixMatch = s.cfg.PrefixIndex.Match(req.Model, req.Prefix, c.Name)
	c.PrefixSource = prefixSourceIndex
}

// recordPrefixLocked tells the index that w is about to serve req's prefix.
func (s *Scheduler) recordPrefixLocked(req Request, w *worker) {
	if s.cfg.PrefixIndex != nil && len(req.Prefix) > 0 {
		s.cfg.PrefixIndex.Record(req.Model, req.Prefix, w.spec.Name)
	}
}

// prefixMatch is the fraction of the request's leading prompt blocks the
// worker is expected to hold in its KV cache, 0..1 (Candidate.PrefixMatch),
// as is: a reward, so a worker that would skip most of the prefill scores
// lower.
//
// Its weight stays below active_requests' (50 against 100 by default): a
// full match is worth half of one request in flight. So a worker holding
// the prefix wins among workers equally loaded, but a busy worker holding
// it loses to an idle one that does not: affinity must not herd a popular
// conversation or system prompt onto one card while others sit idle, which
// would trade a saved prefill for a queue.
type prefixMatch struct{}

func (prefixMatch) Name() string { return "prefix" }
func (prefixMatch) Reward() bool { return true }
func (prefixMatch) Score(_ *Env, c []Candidate, raw, norm []float64) {
	for i := range c {
		raw[i] = c[i].PrefixMatch
		norm[i] = clamp01(raw[i])
	}
}
func (prefixMatch) Provenance(_ *Env, c *Candidate) (string, time.Time, bool) {
	if c.PrefixSource == "" {
		return "no prefix hashes", time.Time{}, false
	}
	return c.PrefixSource, time.Time{}, false
}
