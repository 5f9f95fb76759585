package scheduler

import (
	"container/list"
	"time"
)

// Session affinity: an agent or chat client that names its session
// (Request.Session: a header such as X-Session-ID, the OpenAI
// prompt_cache_key or user, the Anthropic metadata.user_id) is telling the
// router which requests continue one conversation. The scheduler keeps,
// per model and session, the worker that served the session's latest
// request and that request's prompt size, and the prefix term reads it as
// a match: the session's worker is expected to hold the previous prompt,
// which the next turn repeats, so its match is previous prompt / this
// prompt (at most 1). It only raises a match the prefix index or the
// worker's report already gives, never lowers it.
//
// It is a hint under the prefix term's rules, not a pin: the match weighs
// what any prefix match weighs (50 against 100 per request in flight), so
// a session goes back to its worker among equally loaded workers and never
// onto a busy card while another is idle, and the backlog rules
// (affinity.go) treat it as they treat a prefix match. What it adds to the
// index: it needs no prompt blocks (a first short turn, a body the router
// cannot render), and it remembers a session past the index's memory
// (SessionTTL, 30 minutes by default, against the index's 5 minutes; an
// agent's user reading a diff for ten minutes comes back to a worker that
// may still hold the conversation, and a worker that evicted it costs the
// request only the prefill it would have paid anywhere).
//
// The table is bounded (MaxSessions, least recently used out) and lives
// under the scheduler's lock; it is not shared between replicas.

// Defaults of the session table.
const (
	DefaultSessionTTL  = 30 * time.Minute
	DefaultMaxSessions = 65536
)

// prefixSourceSession is Candidate.PrefixSource when the match came from
// the session hint; the record adds where the session key came from.
const prefixSourceSession = "session hint"

// sessionKey is one session of one model.
type sessionKey struct{ model, session string }

// sessionEntry is where a session went last.
type sessionEntry struct {
	key    sessionKey
	worker string
	tokens int    // the prompt size of its latest request
	first  uint64 // its first prefix block's hash, 0 when it had none
	at     time.Time
}

// sessionTable remembers the latest worker of each session, least
// recently used first out. Its zero value is off (nil map).
type sessionTable struct {
	ttl time.Duration
	max int
	ll  *list.List // of *sessionEntry, most recent first
	m   map[sessionKey]*list.Element
}

func newSessionTable(ttl time.Duration, max int) *sessionTable {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return &sessionTable{ttl: ttl, max: max, ll: list.New(), m: map[sessionKey]*list.Element{}}
}

// lookup returns the live entry of a session, or nil.
func (t *sessionTable) lookup(model, session string, now time.Time) *sessionEntry {
	if t == nil || session == "" {
		return nil
	}
	el, ok := t.m[sessionKey{model, session}]
	if !ok {
		return nil
	}
	e := el.Value.(*sessionEntry)
	if now.Sub(e.at) > t.ttl {
		t.ll.Remove(el)
		delete(t.m, e.key)
		return nil
	}
	return e
}

// record notes that worker serves session's request of tokens prompt
// tokens now.
func (t *sessionTable) record(model, session, worker string, tokens int, first uint64, now time.Time) {
	if t == nil || session == "" {
		return
	}
	k := sessionKey{model, session}
	if el, ok := t.m[k]; ok {
		e := el.Value.(*sessionEntry)
		e.worker, e.tokens, e.first, e.at = worker, tokens, first, now
		t.ll.MoveToFront(el)
		return
	}
	for t.ll.Len() >= t.max {
		old := t.ll.Remove(t.ll.Back()).(*sessionEntry)
		delete(t.m, old.key)
	}
	t.m[k] = t.ll.PushFront(&sessionEntry{key: k, worker: worker, tokens: tokens, first: first, at: now})
}

// affine reports whether req has anything the prefix term can match: prompt
// blocks, or a session the table may know.
func (s *Scheduler) affine(req *Request) bool { return s.conf.affine(req) }

// sessionMatch raises c's prefix match to the session hint's when c
// served req's session last (e, nil when the session is unknown) and the
// hint says more. The hint holds only for a prompt that may extend the
// previous one: no shorter than it (a shorter one is a new conversation
// under the same key, or one the client compacted), and starting with the
// same block when both have blocks (a user field shared by unrelated
// conversations would otherwise pull them all onto one card).
func sessionMatch(e *sessionEntry, req *Request, c *Candidate) {
	if e == nil || e.worker != c.Name || e.tokens > req.PromptTokens {
		return
	}
	if e.first != 0 && len(req.Prefix) > 0 && req.Prefix[0] != e.first {
		return
	}
	m := 1.0
	if req.PromptTokens > 0 {
		m = float64(e.tokens) / float64(req.PromptTokens)
	}
	if m > c.PrefixMatch {
		c.PrefixMatch, c.PrefixSource = m, prefixSourceSession
	}
}

// sessionLabel is what a decision record says of req's session: its
// source and the first 8 characters of its digest.
func sessionLabel(req *Request) string {
	if req.Session == "" {
		return ""
	}
	d := req.Session
	if len(d) > 8 {
		d = d[:8]
	}
	src := req.SessionSource
	if src == "" {
		src = "session"
	}
	return src + " #" + d
}
