package scheduler

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/internal/sessions"
)

// PrefixIndex tells where a request's prompt prefix is expected to be in a
// worker's KV cache: the router's own record of which worker served which
// block hashes (*prefix.Index), shared between replicas or not
// (*prefixshare.Index). It is one source of a worker's Belief.
type PrefixIndex interface {
	// MatchSources sets frac[i] to the fraction (0..1) of hashes, counted
	// from the first, that workers[i] is expected to hold for model, and
	// remote[i] to whether any of those blocks was recorded by another
	// replica. A pick asks about all its candidates at once.
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
	// Record notes that worker now serves hashes for model.
	Record(model string, hashes []uint64, worker string)
}

// PrefixCapacity is implemented by a PrefixIndex whose memory of a worker
// can follow the size of the worker's KV cache (*prefix.Index is one): the
// scheduler passes it each worker's Snapshot.KVCacheTokens when that
// changes, so the index remembers no more blocks of a worker than the
// worker can hold, and no fewer.
type PrefixCapacity interface {
	// SetCapacity bounds what is remembered of worker to a KV cache of
	// tokens tokens.
	SetCapacity(worker string, tokens int)
}

// CacheReport is a worker's own account of the prompt prefixes its KV
// cache holds: the router's chained block hashes (see package prefix) of
// the prompt text each of its slots holds, computed by the fleet with the
// same block function the proxy applies to requests. It is immutable once
// published.
//
// # How the prefix term merges it with the router's index
//
// For each candidate the belief takes the router index's guess g and, when
// the worker's report is no older than Config.StaleAfter, the report's
// match r (the leading blocks of the request found in the report). The
// match is max(r, g), and the record names the report as the source when
// r > 0 and r >= g, else the index:
//
//   - A report says for certain what it holds: r > g means the worker
//     holds more than the router remembers (after a router restart, for
//     traffic of other replicas or clients, or past the index's TTL and
//     capacity), and wins.
//   - A report's silence is not evidence: it lists the slots' KV only
//     (llama-server's host-memory prompt cache, --cache-ram, keeps and
//     restores more), it lags the requests the router sent since it was
//     taken, and a chat request's prompt is the worker's chat template's
//     text, whose blocks are not the router's rendering (see
//     prefix.Render), so a conversation the worker holds can be absent
//     from the report. So r < g never lowers the guess.
//   - A report older than StaleAfter is set aside: the guess alone
//     decides, and the record says the report was stale.
//
// The guess is the index's, shared between replicas or not (a shared
// index already holds what other replicas sent).
type CacheReport struct {
	// Source names the report, e.g. "llama.cpp /slots".
	Source string `json:"source"`
	// At is when the worker was asked.
	At time.Time `json:"at"`
	// Blocks holds the chained block hashes of every slot's prompt.
	Blocks map[uint64]struct{} `json:"-"`
	// NBlocks is len(Blocks), for /api/workers.
	NBlocks int `json:"blocks"`
	// Slots is the number of slots that reported a prompt.
	Slots int `json:"slots"`
}

// Match returns the fraction of hashes, counted from the first, that the
// report holds; 0 for no hashes or a nil report.
func (r *CacheReport) Match(hashes []uint64) float64 {
	if r == nil || len(hashes) == 0 {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := r.Blocks[h]; !ok {
			break
		}
		n++
	}
	return float64(n) / float64(len(hashes))
}

// Belief is what the scheduler believes a worker holds of one request's
// prompt prefix in its KV cache. Every source feeds it, in one place
// (beliefSrc.set), and everything that weighs a cached prefix reads it:
// the prefix term, the backlog rules (affinity.go), the prediction of the
// time to first token (promise.go), and the decision record, which names
// the source that set it (Provenance) and, once the worker answers, what
// the worker says it found cached (Lease.Complete).
//
// The sources, in the order they are applied:
//
//  1. The guess: the router's index of where earlier requests went
//     (PrefixIndex), "router index (guess)", or "(shared)" when another
//     replica recorded some of the blocks.
//  2. The worker's own report of its slots (CacheReport, llama.cpp's
//     /slots) raises it when fresh and holding more.
//  3. The session hint (sessions.go) raises it for the worker that served
//     the request's session last.
//  4. The worker's KV-cache events (KVIndex, vLLM's), when they can answer
//     for the worker, replace it: they are exact. A request in flight
//     there (kvsent.go) raises them by the blocks it has not published
//     yet. When the events were lost since a gap, the belief stands and
//     says so.
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
// the candidates: the configuration (the indexes, how old a report may
// be), the time, and where the request's session went last (nil when the
// table does not know it, or is off). A pick resolves it once.
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

// guessBufs returns the slices guesses passes the index, of length n:
// for a single candidate (the affinity rules ask about one worker at a
// time, for every worker) in one allocation rather than three.
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
// answer for c's worker, raised by the blocks of its requests in flight
// there (sent); else the belief stands, and the record says why when
// events were lost.
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

// recordPrefixLocked tells the index that w is about to serve req's
// prefix, and first, when the worker's reported KV cache size changed,
// how much of it the index may remember; and the session table that w
// serves req's session.
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

// Provenance names the source: "router index (guess)" (or "(shared)"),
// or "worker report (llama.cpp /slots, 1.2s old)" with the report's time
// as the value's; when a report did not win, it says how much the report
// held, or that it was stale.
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
