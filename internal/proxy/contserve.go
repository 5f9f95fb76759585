package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// Continued is one continuation of a stream, for metrics and the
// decision record of the lease that continued it.
type Continued struct {
	From, To string // To is empty when no worker could take it
	// Reason is why From's part ended: breakUpstream, breakErrorEvent,
	// breakIdle or breakDrain (breakShutdown is never continued).
	Reason  string
	Carried int // tokens the client had been sent before
	// Gap is from the last token before the break to the first after
	// it; 0 when the continuation sent no token.
	Gap time.Duration
	// Outcome is "ok" (the stream ended well), "failed" (the
	// continuation broke or failed too) or "no_worker".
	Outcome  string
	Decision *decisions.Record // the continuation's; nil with no worker
}

// DecisionContinuation is c as its decision record keeps it.
func (c Continued) DecisionContinuation() decisions.Continuation {
	return decisions.Continuation{From: c.From, Reason: c.Reason, CarriedTokens: c.Carried,
		GapMs: float64(c.Gap) / float64(time.Millisecond), Outcome: c.Outcome}
}

// continuation decides whether the request's stream may be continued
// elsewhere if its worker breaks it, and returns its state if so. Only a
// bad X-Sluice-Continue header is an error.
func (h *Handler) continuation(r *http.Request, body []byte, p parsed) (*contStream, error) {
	off, err := continueHeader(r.Header)
	if err != nil || off || !p.stream || h.opt.MaxContinuations <= 0 {
		return nil, err
	}
	if id, ok := auth.FromContext(r.Context()); ok && id.NoContinue {
		return nil, nil
	}
	route, kinds, ok := canContinue(r.URL.Path, body)
	if !ok {
		return nil, nil
	}
	cs := &contStream{route: route, kinds: kinds, left: h.opt.MaxContinuations}
	cs.canMove.Store(true)
	return cs, nil
}

// broke accounts a part that broke: its worker is blamed unless the
// drain deadline moved it or the router's shutdown cut it, which was not
// its fault.
func (h *Handler) broke(lease *scheduler.Lease, brk *streamBreak, ctx context.Context, res *Result) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errDrained):
		brk.reason, brk.err = breakDrain, errDrained
	case errors.Is(cause, errShutdown):
		brk.reason, brk.err = breakShutdown, errShutdown
	default:
		h.report(lease.Worker, brk)
	}
	res.Reason = "upstream_failed"
	switch brk.reason {
	case breakIdle:
		res.Reason = "stream_idle"
	case breakShutdown:
		res.Reason = "shutting_down"
	}
	h.opt.Logger.Warn("worker broke a stream mid-way", "worker", lease.Worker, "decision", decisionID(lease.Decision), "reason", brk.reason, "err", brk.err)
}

// relayPart relays a continuation's answer (the client's headers are
// sent) and classifies how it ended, as attempt does.
func (h *Handler) relayPart(w http.ResponseWriter, r *http.Request, resp *http.Response, lease *scheduler.Lease, attemptStart time.Time, res *Result, cs *contStream, cancel context.CancelCauseFunc, ctx context.Context) (bool, *stats.Observation, error) {
	answer := newIdleReader(ctx, resp.Body, h.opt.IdleTimeout, cancel)
	defer answer.stop()
	defer h.cutOnShutdown(cancel)()
	m, err := cs.relay(w, answer, attemptStart)
	res.Tokens = cs.emitted()
	if m.promptTokens > 0 {
		res.PromptTokens = m.promptTokens - cs.carried
	}
	var brk *streamBreak
	switch {
	case errors.Is(err, errClientGone) || (r.Context().Err() != nil && !m.complete):
		res.Status, res.Reason = 499, "client_gone"
		return true, nil, nil
	case errors.As(err, &brk):
		h.broke(lease, brk, ctx, res)
		return true, nil, brk
	}
	h.report(lease.Worker, nil)
	res.Reason = ""
	o := observation(m, time.Since(attemptStart))
	if o.DecodeTPS > 0 {
		res.TPOT = time.Duration(float64(time.Second) / o.DecodeTPS)
	}
	return true, &o, nil
}

// continueStream places the rest of a broken stream on another worker
// (the scheduler's admission, ahead of the queue as a retry is, on a kind
// that can continue it) and relays it, as often as the stream's
// continuations allow; a stream that cannot go on ends with the error
// event it would have ended with without continuation. Each part is a
// lease of its own, ended once as every lease is.
func (h *Handler) continueStream(w http.ResponseWriter, r *http.Request, body []byte, p parsed, req scheduler.Request, from string, start time.Time, res *Result, cs *contStream, brk *streamBreak) {
	for {
		if r.Context().Err() != nil {
			res.Status, res.Reason = 499, "client_gone"
			return
		}
		if cs.stuck != "" || cs.left <= 0 || brk.reason == breakShutdown {
			h.endBroken(w, p, res, brk)
			return
		}
		cs.left--
		cs.canMove.Store(cs.left > 0) // a drain may move this part only if another can follow
		cs.carried, cs.part, cs.reported = cs.emitted(), 0, 0
		cs.cont, cs.gap, cs.brokeAt = true, 0, cs.lastTok
		if cs.brokeAt.IsZero() {
			cs.brokeAt = time.Now()
		}
		c := Continued{From: from, Reason: brk.reason, Carried: cs.carried}
		cs.overshoot = 0
		if _, ok, _ := continuationBody(body, cs.route, kindLlamaCPP, "", cs.carried); !ok {
			// Every token the limit allowed was sent: only the end is
			// missing. A worker asked for one token more says it, with
			// the usage; its token is not the client's.
			cs.overshoot = 1
		}
		req.Attempt++
		req.Exclude = append(req.Exclude, from)
		req.Kinds = cs.kinds
		req.PromptTokens = p.promptTokens + cs.carried
		if req.MaxTokens > 0 {
			req.MaxTokens = max(req.MaxTokens-cs.carried, 1)
		}
		lease, err := h.opt.Scheduler.Admit(r.Context(), req)
		if err != nil {
			c.Outcome = "no_worker"
			res.Continuations = append(res.Continuations, c)
			h.opt.Logger.Warn("no worker can continue the stream", "from", from, "decision", decisionID(res.Decision), "err", err)
			if cs.overshoot > 0 { // Sluice can say the end itself
				cs.endEarly(w)
				res.Reason = ""
				return
			}
			h.endBroken(w, p, res, brk)
			return
		}
		aerr := h.continuePart(w, r, body, p, lease, start, res, cs)
		c.To, c.Decision, c.Gap = lease.Worker, lease.Decision, cs.gap
		if aerr == nil {
			c.Outcome = "ok"
			res.Continuations = append(res.Continuations, c)
			return
		}
		c.Outcome = "failed"
		res.Continuations = append(res.Continuations, c)
		var next *streamBreak
		if !errors.As(aerr, &next) {
			// It failed before answering: the stream is still broken
			// where it was (attempt reported it, unless a drain took it
			// back, which is not the worker's failure).
			h.opt.Logger.Warn("the continuation failed before answering", "worker", lease.Worker, "decision", decisionID(lease.Decision), "err", aerr)
			next = &streamBreak{reason: breakUpstream, err: aerr}
			res.Reason = "upstream_failed"
		}
		brk, from = next, lease.Worker
	}
}

// continuePart asks lease's worker for the rest of the stream and relays
// it, ending the lease as attemptLease does (the release deferred, so a
// panic cannot keep the slot).
func (h *Handler) continuePart(w http.ResponseWriter, r *http.Request, body []byte, p parsed, lease *scheduler.Lease, start time.Time, res *Result, cs *contStream) error {
	defer lease.Release()
	kind := ""
	if h.opt.KindOf != nil {
		kind = h.opt.KindOf(lease.Worker)
	}
	nb, _, err := continuationBody(body, cs.route, kind, cs.text.String(), cs.carried-cs.overshoot)
	if err != nil {
		return err
	}
	_, err = h.attemptLease(w, r, nb, p, lease, start, res, cs)
	return err
}

// endBroken ends a stream that breaks for good with Sluice's error
// event, as a stream without continuation ends: what failed, in the
// client's terms (brk.err, logged where it broke, says how).
func (h *Handler) endBroken(w http.ResponseWriter, p parsed, res *Result, brk *streamBreak) {
	rc := http.NewResponseController(w)
	msg := failureOf(p.model, res.Decision).streamEnd(brk.reason, brk.err)
	switch brk.reason {
	case breakIdle:
		writeStreamEnd(p.proto, w, rc, "stream_idle", msg)
		return
	case breakShutdown:
		writeStreamEnd(p.proto, w, rc, "shutting_down", shutdownMessage)
		return
	}
	writeStreamEnd(p.proto, w, rc, "upstream_failed", msg)
}
