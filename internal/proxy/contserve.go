package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
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
func (h *Handler) continuation(r *http.Request, p parsed) (*contStream, error) {
	off, err := continueHeader(r.Header)
	if err != nil || off || !p.stream || h.opt.MaxContinuations <= 0 {
		return nil, err
	}
	if id, ok := auth.FromContext(r.Context()); ok && id.NoContinue {
		return nil, nil
	}
	route, kinds, ok := canContinue(r.URL.Path, p)
	if !ok {
		return nil, nil
	}
	cs := &contStream{proto: p.proto, route: route, kinds: kinds, left: h.opt.MaxContinuations}
	cs.canMove.Store(true)
	return cs, nil
}

// broke accounts a part that broke: its worker is blamed unless the
// drain deadline moved it or the router's shutdown cut it, which was not
// its fault.
func (h *Handler) broke(t *try, brk *streamBreak) {
	switch cause := context.Cause(t.ctx); {
	case errors.Is(cause, errDrained):
		brk.reason, brk.err = breakDrain, errDrained
	case errors.Is(cause, errShutdown) || brk.reason == breakShutdown:
		brk.reason, brk.err = breakShutdown, errShutdown
	default:
		h.report(t.lease.Worker, brk)
	}
	t.res.Reason = brk.code()
	h.opt.Logger.Warn("worker broke a stream mid-way", "worker", t.lease.Worker, "decision", decisionID(t.lease.Decision), "reason", brk.reason, "err", brk.err)
}

// continueStream places the rest of a broken stream on another worker of
// a kind that can continue it, and relays it, as often as the stream's
// continuations allow; a stream that cannot go on (or never could: c.cs
// nil) ends with Sluice's error event. Each part is a lease of its own.
func (h *Handler) continueStream(c *call, req scheduler.Request, from string, brk *streamBreak) {
	cs, res := c.cs, c.res
	for {
		if c.r.Context().Err() != nil {
			res.Status, res.Reason = 499, "client_gone"
			return
		}
		if cs == nil || cs.stuck != "" || cs.left <= 0 || brk.reason == breakShutdown {
			endStream(c.w, c.p.proto, failureOf(c.p.model, res.Decision), brk)
			return
		}
		cs.left--
		cs.canMove.Store(cs.left > 0) // a drain may move this part only if another can follow
		cs.carried, cs.part, cs.reported = cs.emitted(), 0, 0
		cs.cont, cs.gap, cs.brokeAt = true, 0, cs.lastTok
		if cs.brokeAt.IsZero() {
			cs.brokeAt = time.Now()
		}
		cont := Continued{From: from, Reason: brk.reason, Carried: cs.carried}
		cs.overshoot = 0
		if _, ok, _ := continuationBody(c.body, cs.route, kindLlamaCPP, "", cs.carried); !ok {
			// Every token the limit allowed was sent: only the end is
			// missing. A worker asked for one token more says it, with
			// the usage; its token is not the client's.
			cs.overshoot = 1
		}
		req.Attempt++
		req.Exclude = append(req.Exclude, from)
		req.Kinds = cs.kinds
		req.PromptTokens = c.p.promptTokens + cs.carried
		if req.MaxTokens > 0 {
			req.MaxTokens = max(req.MaxTokens-cs.carried, 1)
		}
		lease, err := h.opt.Scheduler.Admit(c.r.Context(), req)
		if err != nil {
			cont.Outcome = "no_worker"
			res.Continuations = append(res.Continuations, cont)
			h.opt.Logger.Warn("no worker can continue the stream", "from", from, "decision", decisionID(res.Decision), "err", err)
			if cs.overshoot > 0 { // Sluice can say the end itself
				cs.endEarly(c.w)
				res.Reason = ""
				return
			}
			endStream(c.w, c.p.proto, failureOf(c.p.model, res.Decision), brk)
			return
		}
		aerr := h.continuePart(c, lease)
		cont.To, cont.Decision, cont.Gap, cont.Outcome = lease.Worker, lease.Decision, cs.gap, "ok"
		if aerr != nil {
			cont.Outcome = "failed"
		}
		res.Continuations = append(res.Continuations, cont)
		if aerr == nil {
			return
		}
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
// it, ending the lease as attemptLease does.
func (h *Handler) continuePart(c *call, lease *scheduler.Lease) error {
	defer lease.Release()
	kind := ""
	if h.opt.KindOf != nil {
		kind = h.opt.KindOf(lease.Worker)
	}
	cs := c.cs
	nb, _, err := continuationBody(c.body, cs.route, kind, cs.text.String(), cs.carried-cs.overshoot)
	if err != nil {
		return err
	}
	_, err = h.attemptLease(c, nb, lease)
	return err
}
