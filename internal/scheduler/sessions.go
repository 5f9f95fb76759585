package scheduler

import "github.com/sluice-router/sluice/internal/sessions"

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
// The table (internal/sessions) is bounded (MaxSessions, least recently
// used out) and lives under the scheduler's lock; it is not shared between
// replicas.

// prefixSourceSession is Candidate.PrefixSource when the match came from
// the session hint; the record adds where the session key came from.
const prefixSourceSession = "session hint"

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
func sessionMatch(e *sessions.Last, req *Request, c *Candidate) {
	if e == nil || e.Worker != c.Name || e.Tokens > req.PromptTokens {
		return
	}
	if e.First != 0 && len(req.Prefix) > 0 && req.Prefix[0] != e.First {
		return
	}
	m := 1.0
	if req.PromptTokens > 0 {
		m = float64(e.Tokens) / float64(req.PromptTokens)
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
