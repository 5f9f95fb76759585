package scheduler

import "github.com/sluice-router/sluice/internal/sessions"

// Session affinity (docs/routing.md, Agent sessions): a client that names
// its session tells the router which requests continue one conversation.
// The table (internal/sessions) keeps, per model and session, the worker
// that served the latest request and its prompt size; the prefix term
// reads it as a match of previous prompt / this prompt on that worker.
// It only raises a match, never lowers it, and weighs what any prefix
// match weighs, so it is a hint rather than a pin. It needs no prompt
// blocks and outlives the prefix index's memory. Not shared between
// replicas.

// prefixSourceSession is Candidate.PrefixSource when the match came from
// the session hint; the record adds where the session key came from.
const prefixSourceSession = "session hint"

// sessionMatch raises c's prefix match to the session hint's when c
// served req's session last (e, nil when unknown) and the hint says more.
// The hint holds only for a prompt that may extend the previous one: no
// shorter, and starting with the same block when both have blocks (a user
// field shared by unrelated conversations would otherwise herd them).
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
