package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// Agent sessions. A coding agent, or any client that keeps a
// conversation, says which session a request belongs to; Sluice reads the
// first of, in order:
//
//   - the headers of Options.SessionHeaders (sessions.headers; by
//     default X-Session-ID, then the headers coding agents send, see
//     config.DefaultSessionHeaders);
//   - OpenAI's prompt_cache_key body field (what OpenAI itself routes its
//     prompt cache by);
//   - OpenAI's user field;
//   - Anthropic's metadata.user_id: Claude Code puts its session in it,
//     as a JSON object's session_id or, in older versions, after
//     "_session_" in user_<hash>_account_<id>_session_<uuid>; that part
//     is taken when present, the whole value otherwise.
//
// The key goes to the scheduler as a digest (the first 16 bytes of its
// SHA-256, in hex), never as sent: a user field may be an e-mail address,
// and the scheduler keeps keys in memory and names them in records. The
// source is kept in words ("header x-session-id", "prompt_cache_key",
// "user", "metadata.user_id") for the record.

// maxSessionKey bounds a session key's length; a longer one is cut (its
// digest still tells sessions apart).
const maxSessionKey = 512

// sessionKey returns the request's session key and where it came from,
// or "" when the request names none.
func (h *Handler) sessionKey(r *http.Request, p parsed) (key, source string) {
	for _, name := range h.opt.SessionHeaders {
		if v := strings.TrimSpace(r.Header.Get(name)); v != "" {
			return v, "header " + strings.ToLower(name)
		}
	}
	switch {
	case p.promptCacheKey != "":
		return p.promptCacheKey, "prompt_cache_key"
	case p.user != "":
		return p.user, "user"
	case p.metadataUserID != "":
		return claudeSession(p.metadataUserID), "metadata.user_id"
	}
	return "", ""
}

// claudeSession is the session part of a metadata.user_id as Claude Code
// writes it, else the whole value.
func claudeSession(uid string) string {
	var obj struct {
		SessionID string `json:"session_id"`
	}
	if strings.HasPrefix(uid, "{") && json.Unmarshal([]byte(uid), &obj) == nil && obj.SessionID != "" {
		return obj.SessionID
	}
	if _, s, ok := strings.Cut(uid, "_session_"); ok && s != "" {
		return s
	}
	return uid
}

// sessionDigest is what the scheduler is given of a key.
func sessionDigest(key string) string {
	if len(key) > maxSessionKey {
		key = key[:maxSessionKey]
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// session fills req's session and, with fair share by session, its flow.
func (h *Handler) session(r *http.Request, p parsed, req *scheduler.Request) {
	key, src := h.sessionKey(r, p)
	if key == "" {
		return
	}
	req.Session, req.SessionSource = sessionDigest(key), src
	if h.opt.FairShareBySession {
		// A flow within the tenant's share: a client that names more
		// sessions splits its tenant's share, it does not add to it.
		req.Flow = req.Session
	}
}
