package config

import (
	"fmt"
	"time"
)

// Sessions configures how an agent's or a chat client's session is
// recognised and used (proxy/session.go, scheduler/sessions.go): a
// session key from a header or the body, used as a prefix-affinity hint
// and, with admission.fair_share_by: session, as the fair-share flow.
type Sessions struct {
	// Affinity sends a session back to the worker that served its last
	// request, under the prefix term's weight. Not a key: it is always
	// on in a router; the simulation's tests turn it off to compare.
	Affinity bool `yaml:"-"`
	// Headers are read in order for the session key, before the body's
	// prompt_cache_key, user and metadata.user_id; left out,
	// DefaultSessionHeaders; an empty list reads the body only.
	Headers []string `yaml:"headers"`
	// TTL is how long a session is remembered after its last request.
	TTL time.Duration `yaml:"ttl"`
	// MaxSessions bounds how many sessions are remembered (least recently
	// used out).
	MaxSessions int `yaml:"max_sessions"`
}

// Fair-share flows (admission.fair_share_by).
const (
	FairShareByTenant  = "tenant"
	FairShareBySession = "session"
)

// DefaultSessionHeaders are the headers read for a session key when
// sessions.headers is left out: X-Session-ID, then the headers coding
// agents send — Claude Code's X-Claude-Code-Session-Id (since v2.1.86,
// coder/aibridge#241), the Codex CLI's session-id and its older
// session_id (KarpelesLab/teamclaude#352, router-for-me/CLIProxyAPI#4452),
// OpenCode's X-Session-Affinity (BYK/loreai#687).
var DefaultSessionHeaders = []string{"X-Session-ID", "X-Claude-Code-Session-Id", "Session-Id", "Session_id", "X-Session-Affinity"}

// validateSessions reports the problems of the sessions section and of
// admission.fair_share_by.
func (c *Config) validateSessions(bad report) {
	for i, h := range c.Sessions.Headers {
		if !validHeaderName(h) {
			bad(fmt.Sprintf("sessions.headers[%d]", i), "%q is not a header name", h)
		}
	}
	positive(bad, "sessions.ttl", c.Sessions.TTL)
	if c.Sessions.MaxSessions < 1 {
		bad("sessions.max_sessions", "must be at least 1, got %d", c.Sessions.MaxSessions)
	}
	if f := c.Admission.FairShareBy; f != FairShareByTenant && f != FairShareBySession {
		bad("admission.fair_share_by", "unknown flow %q (tenant or session)", f)
	}
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110
// token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' || c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}
