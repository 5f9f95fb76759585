package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/sessions"
)

// PrefixIndex tells where a request's prompt prefix is expected to be in a
// worker's KV cache, from where the router sent earlier requests
// (*prefix.Index, or *prefixshare.Index across replicas).
type PrefixIndex interface {
	// MatchSources sets frac[i] to the fraction (0..1) of hashes, counted
	// from the first, that workers[i] is expected to hold for model, and
	// remote[i] to whether another replica recorded any of those blocks.
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
	// Record notes that worker now serves hashes for model.
	Record(model string, hashes []uint64, worker string)
}

// PrefixCapacity is implemented by a PrefixIndex whose memory of a worker
// follows the size of the worker's KV cache (Snapshot.KVCacheTokens,
// passed when it changes).
type PrefixCapacity interface {
	// SetCapacity bounds what is remembered of worker to a KV cache of
	// tokens tokens.
	SetCapacity(worker string, tokens int)
}

// Belief is what the scheduler believes a worker holds of one request's
// prompt prefix in its KV cache. Every source feeds it in one place
// (beliefSrc.set), in this order, and the prefix term, the backlog rules,
// the prediction and the record all read it:
//
//  1. the router index's guess (PrefixIndex);
//  2. the worker's own report (CacheReport), raising it when fresh and
//     holding more, never lowering it: a report lists the slots' KV only,
//     lags the requests sent since and hashes the chat template's text,
//     so its silence is not evidence;
//  3. the session hint (sessions.go), raising it for the session's worker;
//  4. the worker's KV-cache events (KVIndex), which replace it when they
//     can answer, raised by the blocks of requests in flight there
//     (kvsent.go).
type Belief struct {
	// PrefixMatch is the fraction (0..1) of the request's leading prompt
	// blocks the worker is believed to hold; PrefixSource names the source
	// that set it (empty: nothing to match).
	PrefixMatch  float64
	PrefixSource string
	// KVSeq is the seq of the last KV-event batch behind PrefixMatch,
	// when the worker's KV events answered.
	KVSeq int64
}

// The sources of a Belief (PrefixSource); the record's words are built
// from them in prefixMatch.Provenance.
const (
	// prefixSourceIndex: the router's index, a guess from where earlier
	// requests went (the worker reports nothing better).
	prefixSourceIndex = "router index (guess)"
	// prefixSourceShared is prefixSourceIndex when some of the matched
	// blocks were recorded by another replica.
	prefixSourceShared = "router index (shared)"
	// prefixSourceReport: the worker's own report of its cache.
	prefixSourceReport = "worker report"
	// prefixSourceKV: the worker's own KV-cache events, exact.
	prefixSourceKV = "vLLM KV events"
	// prefixSourceKVLost: the guess, the worker's events being lost since
	// a gap that could not be replayed.
	prefixSourceKVLost = "router index (guess); KV events lost since a gap"
	// prefixSourceKVSent: the worker's events, and beyond them the blocks
	// of a request in flight there that it has not published yet.
	prefixSourceKVSent = "vLLM KV events + a request in flight there"
)

// KVIndex answers how many of a request's leading blocks a worker holds,
// from the worker's KV-cache events; ok is false when it cannot say (no
// events yet, or lost since a gap: why), and the guess stands.
type KVIndex interface {
	Match(worker string, keys []uint64) (n int, seq int64, ok bool, why string)
}

// beliefSrc is what the sources of a Belief read besides the request and
// the candidates, resolved once per pick; session is where the request's
// session went last (nil when unknown or off).
type beliefSrc struct {
	conf    *pickConf
	now     time.Time
	session *sessions.Last
}

// set sets the Belief of each of cands, zeroed, about req, from every
// source in the order Belief gives; sent(j) are the blocks in flight on
// the worker of cands[j] (kvsent.go).
func (b *beliefSrc) set(req *Request, cands []Candidate, sent func(j int) []kvSent) {
	cfg := b.conf.cfg
	if cfg.PrefixIndex != nil && b.conf.affine(req) {
		b.guesses(req, cands)
	}
	if len(req.KVBlocks) > 0 && cfg.KVIndex != nil {
		for j := range cands {
			b.kvBelief(req, &cands[j], sent(j))
		}
	}
}

// guesses is the guess of the index for every one of cands, asked at
// once, raised by the worker's report and the session hint.
func (b *beliefSrc) guesses(req *Request, cands []Candidate) {
	names, frac, remote := guessBufs(len(cands))
	for i := range cands {
		names[i] = cands[i].Name
	}
	b.conf.cfg.PrefixIndex.MatchSources(req.Model, req.Prefix, names, frac, remote)
	for i := range cands {
		c := &cands[i]
		c.PrefixMatch, c.PrefixSource = frac[i], prefixSourceIndex
		if remote[i] {
			c.PrefixSource = prefixSourceShared
		}
		b.reportMatch(req, c)
		sessionMatch(b.session, req, c)
	}
}

// guessBufs returns the slices guesses passes the index, of length n, in
// one allocation for the common single candidate (the affinity rules ask
// about one worker at a time).
func guessBufs(n int) ([]string, []float64, []bool) {
	const few = 1
	if n != few {
		return make([]string, n), make([]float64, n), make([]bool, n)
	}
	b := new(struct {
		names  [few]string
		frac   [few]float64
		remote [few]bool
	})
	return b.names[:n], b.frac[:n], b.remote[:n]
}

// kvBelief replaces c's belief with the worker's KV events when they can
// answer for it, raised by its requests in flight there (sent); else the
// belief stands, and the record says when events were lost.
func (b *beliefSrc) kvBelief(req *Request, c *Candidate, sent []kvSent) {
	n, seq, ok, why := b.conf.cfg.KVIndex.Match(c.Name, req.KVBlocks)
	switch {
	case ok:
		src := prefixSourceKV
		if m := kvSentMatch(sent, req.KVBlocks); m > n {
			n, src = m, prefixSourceKVSent
		}
		c.PrefixMatch, c.PrefixSource, c.KVSeq = float64(n)/float64(len(req.KVBlocks)), src, seq
	case why != "" && why != "no KV events yet":
		c.PrefixSource = prefixSourceKVLost
	}
}

// reportMatch raises c's prefix match to what its worker's own cache
// report says, when the report is fresh and says more.
func (b *beliefSrc) reportMatch(req *Request, c *Candidate) {
	rep, stale := c.Snap.CacheReport, b.conf.cfg.StaleAfter
	if rep == nil || (stale > 0 && b.now.Sub(rep.At) > stale) {
		return
	}
	if r := rep.Match(req.Prefix); r > 0 && r >= c.PrefixMatch {
		c.PrefixMatch, c.PrefixSource = r, prefixSourceReport
	}
}

// recordPrefixLocked tells the session table and the prefix index that w
// serves req, and first the index how much of w's KV cache it may
// remember when that changed.
func (s *Scheduler) recordPrefixLocked(req Request, w *worker) {
	if s.sessions != nil && req.Session != "" { // else nothing to record, and no clock to read
		var first uint64
		if len(req.Prefix) > 0 {
			first = req.Prefix[0]
		}
		s.sessions.Record(req.Model, req.Session, sessions.Last{Worker: w.spec.Name, Tokens: req.PromptTokens, First: first, At: s.clock.Now()})
	}
	if s.cfg.PrefixIndex == nil || len(req.Prefix) == 0 {
		return
	}
	if pc, ok := s.cfg.PrefixIndex.(PrefixCapacity); ok {
		if n := w.snapshot().KVCacheTokens; n > 0 && n != w.prefixKV {
			pc.SetCapacity(w.spec.Name, n)
			w.prefixKV = n
		}
	}
	s.cfg.PrefixIndex.Record(req.Model, req.Prefix, w.spec.Name)
}

// prefixMatch is the fraction of the request's leading prompt blocks the
// worker is expected to hold in its KV cache, 0..1: a reward. Its default
// weight is half of one request in flight, so a busy holder loses to an
// idle worker: affinity must not herd a popular prefix onto one card.
type prefixMatch struct{}

func (prefixMatch) Name() string { return "prefix" }
func (prefixMatch) Reward() bool { return true }
func (prefixMatch) Score(_ *Env, c []Candidate, raw, norm []float64) {
	for i := range c {
		raw[i] = c[i].PrefixMatch
		norm[i] = clamp01(raw[i])
	}
}

// Provenance names the source that set the match; when a report did not
// win, it says how much the report held, or that it was stale.
func (prefixMatch) Provenance(env *Env, c *Candidate) (string, time.Time, bool) {
	rep := c.Snap.CacheReport
	switch {
	case c.PrefixSource == "":
		return "no prefix hashes", time.Time{}, false
	case c.PrefixSource == prefixSourceSession && env.Req != nil:
		return "session hint: served this session's last request (" + env.Req.SessionSource + ")", time.Time{}, false
	case c.PrefixSource == prefixSourceKV:
		return fmt.Sprintf("%s, seq %d", prefixSourceKV, c.KVSeq), time.Time{}, false
	case c.PrefixSource == prefixSourceKVSent:
		return fmt.Sprintf("vLLM KV events, seq %d, + a request in flight there, its blocks not yet published", c.KVSeq), time.Time{}, false
	case c.PrefixSource == prefixSourceReport:
		return fmt.Sprintf("worker report (%s, %s old)", rep.Source, age(env.Now, rep.At)), rep.At, false
	case rep == nil || env.Req == nil:
		return c.PrefixSource, time.Time{}, false
	case env.StaleAfter > 0 && env.Now.Sub(rep.At) > env.StaleAfter:
		return fmt.Sprintf("%s; %s report %s old, stale", c.PrefixSource, rep.Source, age(env.Now, rep.At)), time.Time{}, false
	}
	return fmt.Sprintf("%s; %s report %s old holds %.2f", c.PrefixSource, rep.Source, age(env.Now, rep.At), rep.Match(env.Req.Prefix)), time.Time{}, false
}

// age is now-at to a tenth of a second, for records.
func age(now, at time.Time) time.Duration {
	return max(now.Sub(at), 0).Round(100 * time.Millisecond)
}
