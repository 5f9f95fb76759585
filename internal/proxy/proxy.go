// Package proxy is Sluice's request path: it reads just enough of a
// request to admit it, waits for the scheduler's lease, relays the request
// to the chosen worker and its answer back (SSE flushed as it arrives),
// and measures what the worker achieved for the moving averages and what
// the client saw for metrics and decision records.
//
// A worker that fails before any byte reached the client (connection
// refused, 5xx) is reported to health tracking and the request is placed
// again on another worker, ahead of newer requests. After the first byte
// the response belongs to the client: a failure then ends the stream with
// an error event.
//
// The relay is written by hand rather than with httputil.ReverseProxy
// because Sluice must see every SSE event (to count tokens and catch a
// worker's in-stream error events) and must be able to retry a request
// whose first attempt failed before the response began.
//
// # Concurrency Model
//
// Handler is stateless apart from its collaborators, each safe for
// concurrent use: the scheduler (admission), the stats tracker
// (averages), the reporter (health) and the metrics. Each request runs in
// its own handler goroutine and owns its lease until it ends it: with
// Lease.Complete for an answer relayed in full (which files its
// measurements before giving the slot back), else with Release, deferred
// from the moment the lease is had, so that a panic cannot keep the slot.
package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// Reporter receives the outcome of each attempt on a worker, for passive
// health checking: consecutive failures eject a worker.
type Reporter interface {
	ReportRequest(worker string, err error)
}

// Result is what the proxy tells its metrics hook about one request.
type Result struct {
	Worker string // empty when never placed
	Status int
	Reason string // X-Sluice-Reason of a refusal or failure
	// Model is the requested model when the fleet serves it, else empty:
	// a client must not be able to mint metric label values.
	Model     string
	QueueWait time.Duration
	// TTFT is time to first token as the client saw it: from the
	// request's arrival (ServeHTTP began) to its first token relayed, so
	// parsing, the wait in Sluice's queue and attempts that failed before
	// answering count. WorkerTTFT is the worker's share: from sending to
	// the worker that answered to its first token, what the moving
	// averages learn. Both are 0 when unknown (not streamed).
	TTFT       time.Duration
	WorkerTTFT time.Duration
	E2E        time.Duration
	Tokens     int
	// PromptTokens is the worker's count from usage when it gave one,
	// else Sluice's estimate; 0 when the request was never parsed.
	PromptTokens int
	// TPOT is the time per output token after the first, of a successful
	// answer; 0 when unknown.
	TPOT     time.Duration
	Attempts int
	// StaleRetries names the worker of each resend on a fresh connection
	// after a pooled connection turned out closed (see Handler).
	StaleRetries []string
	// Decision is the record of the decision that placed the attempt that
	// answered (nil when never placed), for filing its first token.
	Decision *decisions.Record
	// Continuations are the times the stream was continued on another
	// worker after its worker broke it, in order.
	Continuations []Continued
}

// Options configures a Handler.
type Options struct {
	// Scheduler admits requests.
	Scheduler *scheduler.Scheduler
	// Resolve returns the base URL of a worker by name.
	Resolve func(worker string) (*url.URL, bool)
	// Credentials returns a worker's own API key, sent as "Authorization:
	// Bearer" in place of the client's, and whether the client's
	// Authorization may be forwarded to a worker without a key. The
	// client's header is dropped otherwise, and when Credentials is nil.
	Credentials func(worker string) (apiKey string, forwardClientAuth bool)
	// Observer receives the measurements of each finished request (the
	// stats tracker, for the averages), through Lease.Complete; nil
	// discards them.
	Observer scheduler.Observer
	// Reporter receives per-attempt outcomes; nil discards them.
	Reporter Reporter
	// OnResult is called once per request when it ends; may be nil.
	OnResult func(Result)
	// Transport sends requests to workers; http.DefaultTransport if nil.
	// When it has a RoundTripFresh method (see freshSender), a request
	// whose pooled connection was found closed is resent through it,
	// else through RoundTrip.
	Transport http.RoundTripper
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes int64
	// BodyTimeout bounds the time a client has to send its body, from
	// the handler's start (408 beyond it); 0 sets no deadline.
	BodyTimeout time.Duration
	// MaxAttempts bounds how many workers a request is tried on.
	MaxAttempts int
	// IdleTimeout bounds the silence between reads of a worker's answer
	// after its headers; 0 means one minute.
	IdleTimeout time.Duration
	// KVBlocks, when set, returns the keys of a chat or completion
	// request's prompt token blocks (kvevents.BlockKeys) from the
	// tokenizer of a worker publishing KV-cache events for model, given
	// the request's messages (with the fields that shape their chat
	// template) or, without them, its prompt string; nil
	// when it cannot. It is called before the request is submitted, and
	// sets Request.KVBlocks; it bounds its own call to the worker, so a
	// fleet without KV events pays for no timer per request.
	KVBlocks func(ctx context.Context, model string, in TokenizeInput) []uint64
	// Logger logs failures; discarded if nil.
	Logger *slog.Logger
	// Tracer, when not nil, gives each request a span (see Tracer).
	Tracer Tracer
	// SessionHeaders are the headers read, in order, for a request's
	// session key before its body's fields (session.go); none when empty.
	SessionHeaders []string
	// FairShareBySession makes each session its own fair-share flow in
	// the queue (within its tenant), instead of one flow per tenant.
	FairShareBySession bool
	// MaxContinuations is how many times one stream may be continued on
	// another worker after its worker broke it (see continue.go); 0
	// never continues.
	MaxContinuations int
	// KindOf returns a worker's engine kind, which says how a
	// continuation is asked of it; nil or "" is llama.cpp's way.
	KindOf func(worker string) string
}

// Handler proxies inference requests. Mount it on the inference paths.
//
// A worker closes keep-alive connections it has kept idle for a while
// (llama-server after 5 s), and a request sent on such a connection just
// as the worker closes it fails with EOF or a reset before any byte of an
// answer. Such a request, on a reused connection and before any byte, is
// sent once more to the same worker on a connection of its own, and the
// first failure is not counted against the worker's health: it says
// nothing about the worker. Result.StaleRetries counts these resends.
type Handler struct {
	opt Options
	// fresh sends a request on a new connection, never a pooled one.
	fresh func(*http.Request) (*http.Response, error)
	// ratio calibrates prompt estimates on what workers counted.
	ratio *tokenRatio
	// live are the continuable streams in flight, for drain deadlines.
	live liveStreams
	// stopping ends when EndStreams is called: every stream being relayed
	// is then ended with an error event.
	stopping   context.Context
	endStreams context.CancelFunc
}

// freshSender is a transport that can send a request on a connection of
// its own rather than one from its idle pool.
type freshSender interface {
	RoundTripFresh(*http.Request) (*http.Response, error)
}

// New returns a Handler.
func New(opt Options) *Handler {
	if opt.Transport == nil {
		opt.Transport = http.DefaultTransport
	}
	fresh := opt.Transport.RoundTrip // may pick another pooled connection
	if t, ok := opt.Transport.(freshSender); ok {
		fresh = t.RoundTripFresh
	}
	if opt.MaxAttempts < 1 {
		opt.MaxAttempts = 1
	}
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = 8 << 20
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = time.Minute
	}
	h := &Handler{opt: opt, fresh: fresh, ratio: newTokenRatio()}
	h.stopping, h.endStreams = context.WithCancel(context.Background())
	return h
}

// errShutdown is the cause an attempt's context is cancelled with when
// EndStreams cuts its stream.
var errShutdown = errors.New("the router is shutting down")

// shutdownMessage is what the error event ending a stream cut by
// EndStreams says to the client.
const shutdownMessage = "the router is shutting down and ended this stream at the end of its grace period; send the request again"

// EndStreams ends every stream being relayed: the client gets, after the
// events it had, an error event with code shutting_down (Anthropic's
// overloaded_error on /v1/messages) and no [DONE], so it can tell a
// shutdown from a network fault; the worker's request is cancelled and
// the worker is not blamed. The server calls it when its shutdown grace
// period ends. An answer that begins after it, and a non-streamed answer
// (whose client could not tell a cut body from a whole one), are left to
// finish, or to be cut with their connection.
func (h *Handler) EndStreams() { h.endStreams() }

// cutOnShutdown arranges for EndStreams to end the stream an attempt
// relays, by cancelling it with errShutdown; the returned func undoes it.
func (h *Handler) cutOnShutdown(cancel context.CancelCauseFunc) (stop func() bool) {
	if h.stopping.Err() != nil {
		return func() bool { return false } // began after EndStreams
	}
	return context.AfterFunc(h.stopping, func() { cancel(errShutdown) })
}

// hopHeaders are removed when forwarding, in both directions (RFC 9110
// section 7.6.1), as net/http/httputil does.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// ServeHTTP handles one inference request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	res := Result{}
	defer func() {
		res.E2E = time.Since(start)
		if h.opt.OnResult != nil {
			h.opt.OnResult(res)
		}
	}()
	r, endSpan := h.startSpan(r)
	defer endSpan(&res)
	proto := protocolFor(r.URL.Path) // the API's body, errors and stream events
	if r.Method != http.MethodPost {
		res.Status, res.Reason = proto.writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "", fmt.Sprintf("%s %s: use POST", r.Method, r.URL.Path))
		return
	}
	body, err := h.readBody(w, r)
	if err != nil {
		res.Status, res.Reason = h.bodyError(proto, w, err)
		return
	}
	p, err := proto.parse(body)
	p.proto = proto
	if err != nil {
		var bad *badRequest
		param := ""
		if errors.As(err, &bad) {
			param = bad.param
		}
		res.Status, res.Reason = proto.writeError(w, http.StatusBadRequest, "invalid_request", param, err.Error())
		return
	}
	if p.model == "" { // native /completion: the model the fleet serves
		models := h.opt.Scheduler.Models()
		if len(models) != 1 {
			res.Status, res.Reason = proto.writeError(w, http.StatusBadRequest, "invalid_request", "model", fmt.Sprintf("field \"model\" is required when the fleet serves %d models", len(models)))
			return
		}
		p.model = models[0]
	}
	h.serve(&call{w: w, r: r, body: body, p: p, start: start, res: &res})
}

// call is one client request on its way through the proxy: what each
// attempt at it reads, and what it tells the client and the metrics.
type call struct {
	w     http.ResponseWriter
	r     *http.Request
	body  []byte // as the client sent it
	p     parsed
	start time.Time // its arrival
	res   *Result
	cs    *contStream // a stream that may be continued elsewhere; else nil
}

// serve places the request and relays it, retrying on another worker while
// nothing has been written to the client.
func (h *Handler) serve(c *call) {
	w, r, res := c.w, c.r, c.res
	req, ok := h.prepare(c)
	if !ok {
		return
	}
	var lastErr error
	// moved counts the placements a drain deadline took back before the
	// worker answered: they are no worker's failure, so they do not use
	// up proxy.max_attempts (each excludes a draining worker, which the
	// scheduler would not choose again anyway, so they are bounded).
	moved := 0
	for ; req.Attempt <= h.opt.MaxAttempts+moved; req.Attempt++ {
		lease, err := h.opt.Scheduler.Admit(r.Context(), req)
		if !errors.Is(err, scheduler.ErrUnknownModel) {
			res.Model = c.p.model // served by the fleet: safe as a label value
		}
		if err != nil {
			if lastErr != nil && errors.Is(err, scheduler.ErrNoHealthyWorker) {
				break // nobody left to retry on: report the worker failure
			}
			res.Status, res.Reason = writeRefusal(c.p.proto, w, err, c.p.model)
			return
		}
		res.Attempts = req.Attempt
		res.Worker, res.QueueWait, res.Decision = lease.Worker, lease.QueueWait, lease.Decision
		sent, err := h.attemptLease(c, c.body, lease)
		var brk *streamBreak
		if errors.As(err, &brk) {
			h.continueStream(c, req, lease.Worker, brk)
			return
		}
		if err == nil || sent {
			return
		}
		if r.Context().Err() != nil { // the client left before an answer
			res.Status, res.Reason = 499, "client_gone"
			return
		}
		lastErr = err
		req.Exclude = append(req.Exclude, lease.Worker)
		if errors.Is(err, errDrained) {
			moved++
			h.opt.Logger.Info("drain deadline passed before the worker answered: placing the request again", "worker", lease.Worker, "attempt", req.Attempt, "decision", decisionID(lease.Decision))
			continue
		}
		h.opt.Logger.Warn("worker failed before responding", "worker", lease.Worker, "attempt", req.Attempt, "decision", decisionID(lease.Decision), "err", err)
	}
	// The client is told what failed in its terms; the log has each
	// worker's error, under the decision named here.
	if id := decisionID(res.Decision); id != "" {
		w.Header().Set("X-Sluice-Decision", id)
	}
	res.Status, res.Reason = c.p.proto.writeError(w, http.StatusBadGateway, "upstream_failed", "", failureOf(c.p.model, res.Decision).noAnswer())
}

// prepare makes the scheduler's request of a call, with its prompt size
// as well as Sluice can tell it, and notes whether its stream may be
// continued (c.cs). A bad header is answered here, and ok is false.
func (h *Handler) prepare(c *call) (req scheduler.Request, ok bool) {
	r, p, res := c.r, &c.p, c.res
	req = scheduler.Request{Model: p.model, PromptTokens: p.promptTokens, PromptSource: SourceEstimate, MaxTokens: p.maxTokens, Attempt: 1, Route: p.proto.route,
		BodyBytes: len(c.body)}
	if id, ok := auth.FromContext(r.Context()); ok {
		req.Tenant, req.Class, req.SLO = id.Tenant, id.Class, id.SLO
	}
	h.session(r, *p, &req)
	// A client may tighten its SLO, never loosen it (X-Sluice-TTFT-SLO,
	// X-Sluice-Min-Decode).
	slo, err := predict.Tighten(req.SLO, r.Header.Get)
	if err != nil {
		res.Status, res.Reason = p.proto.writeError(c.w, http.StatusBadRequest, "invalid_header", "", err.Error())
		return req, false
	}
	req.SLO = slo
	if c.cs, err = h.continuation(r, *p); err != nil {
		res.Status, res.Reason = p.proto.writeError(c.w, http.StatusBadRequest, "invalid_header", "", err.Error())
		return req, false
	}
	if n, src, ok := h.ratio.estimate(*p); ok {
		req.PromptTokens, req.PromptSource = n, src
		p.promptTokens = n
	}
	req.Prefix = p.prefix // where its prompt prefix may be cached
	req.KVBlocks = h.kvBlocks(r.Context(), *p)
	res.PromptTokens = p.promptTokens
	req.Class = h.opt.Scheduler.RequestedClass(req.Class, r.Header.Get("X-Sluice-Priority"))
	return req, true
}

// attemptLease makes one attempt on lease with body and ends the lease:
// with Complete for an answer relayed in full, else with Release. The
// release is deferred, so a panic (which net/http recovers) cannot keep
// the slot; after Complete it does nothing.
func (h *Handler) attemptLease(c *call, body []byte, lease *scheduler.Lease) (sent bool, err error) {
	defer lease.Release()
	sent, done, err := h.attempt(c, body, lease)
	if done != nil {
		lease.Complete(*done, h.opt.Observer, time.Now())
	}
	return sent, err
}

// SourceEstimate is where a request's prompt size came from, as decision
// records say, until workers have counted some of the model's prompts
// (SourceCalibrated).
const SourceEstimate = "estimate: text/4"

// TokenizeInput is what a worker's POST /tokenize is given for a
// request's token ids: vLLM's TokenizeChatRequest (Messages, with
// Template) or TokenizeCompletionRequest (Prompt, a JSON string).
type TokenizeInput struct {
	Messages json.RawMessage
	// Template is the chat request's fields that change what its chat
	// template renders, as sent, in templateFields' order: the ids of the
	// messages without them are those of another prompt (a template
	// renders tools ahead of the messages, and chat_template_kwargs may
	// switch a model's thinking on or off).
	Template []Field
	Prompt   json.RawMessage
}

// Field is one JSON field of a request body, as sent.
type Field struct {
	Name  string
	Value json.RawMessage
}

// kvBlocks gets the request's token blocks for the exact index of KV
// events, within the tokenize budget; nil without the hook or a prompt.
func (h *Handler) kvBlocks(ctx context.Context, p parsed) []uint64 {
	in := TokenizeInput{Messages: p.messages, Template: p.template}
	if firstByte(p.prompt) == '"' {
		in.Prompt = p.prompt
	}
	if h.opt.KVBlocks == nil || (len(in.Messages) == 0 && len(in.Prompt) == 0) {
		return nil
	}
	return h.opt.KVBlocks(ctx, p.model, in)
}

// try is one attempt of a call on a lease's worker.
type try struct {
	*call
	lease *scheduler.Lease
	body  []byte // what the worker is sent
	// ctx is the attempt's own context: the idle timer, a drain
	// deadline and the router's shutdown end the attempt through cancel
	// without touching the client's request.
	ctx    context.Context
	cancel context.CancelCauseFunc
	sent   time.Time // when the request went to the worker
}

// cont reports whether the attempt continues a broken stream, whose
// client has its headers.
func (t *try) cont() bool { return t.cs != nil && t.cs.cont }

// attempt sends body to the lease's worker and relays the answer. It
// reports whether anything was written to the client (when nothing was
// and err is not nil, the caller may retry elsewhere) and the measurement
// of an answer that succeeded, for Lease.Complete. A stream that broke
// after the first byte returns a *streamBreak, for the caller to continue
// elsewhere or end; a part continuing a broken stream writes no headers.
//
// attempt is the one place that reports an attempt's outcome for health:
// once per attempt, a failure only where the worker failed, never for a
// client that left, a drain deadline, or a worker without an address.
func (h *Handler) attempt(c *call, body []byte, lease *scheduler.Lease) (sent bool, done *stats.Observation, err error) {
	t := &try{call: c, lease: lease, body: body}
	t.ctx, t.cancel = context.WithCancelCause(c.r.Context())
	defer t.cancel(nil)
	if c.cs != nil {
		defer h.live.add(lease.Worker, c.cs, t.cancel)()
	}
	resp, err := h.send(t)
	if err != nil {
		return false, nil, err
	}
	defer resp.Body.Close()
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if err := h.refused(t, resp, sse); err != nil {
		return false, nil, err
	}
	if !t.cont() {
		h.writeHeader(t, resp)
	}
	answer := newIdleReader(t.ctx, resp.Body, h.opt.IdleTimeout, t.cancel)
	defer answer.stop()
	var m measured
	var st *contStream
	if sse {
		defer h.cutOnShutdown(t.cancel)()
		if st = c.cs; st == nil {
			st = &contStream{proto: c.p.proto} // one part, as it comes
		}
		m, err = st.relay(c.w, answer, t.sent)
	} else {
		m, err = relayWhole(c.w, answer, maxParse)
	}
	done, err = h.ended(t, resp.StatusCode, st, m, err)
	return true, done, err
}

// send sends the attempt's request to its worker, once more on a
// connection of its own when the pooled one it went on turns out closed
// by the worker. A failure is reported for health unless the client
// left or a drain deadline took the request back.
func (h *Handler) send(t *try) (*http.Response, error) {
	r, lease := t.r, t.lease
	base, ok := h.opt.Resolve(lease.Worker)
	if !ok {
		return nil, fmt.Errorf("worker %s has no address", lease.Worker)
	}
	var reused atomic.Bool // whether the connection used came from the pool
	ctx := httptrace.WithClientTrace(t.ctx, &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) { reused.Store(ci.Reused) },
	})
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath(r.URL.Path).String(), bytes.NewReader(t.body))
	if err != nil {
		return nil, fmt.Errorf("build request for %s: %w", lease.Worker, err)
	}
	out.URL.RawQuery = r.URL.RawQuery
	copyHeader(out.Header, r.Header)
	h.setAuth(out.Header, lease.Worker)
	// Who asked: the client's address appended to X-Forwarded-For, its
	// Host and scheme.
	(&httputil.ProxyRequest{In: r, Out: out}).SetXForwarded()
	if s := spanFrom(r.Context()); s != nil {
		s.Attempt(r.Context(), lease, out.Header)
	}
	// Sluice must read the answer to meter it: let the transport negotiate
	// compression with the worker and decompress, and relay plain bytes.
	out.Header.Del("Accept-Encoding")
	out.ContentLength = int64(len(t.body))
	t.sent = time.Now()
	resp, err := h.opt.Transport.RoundTrip(out)
	if err != nil && reused.Load() && staleConn(err) && r.Context().Err() == nil {
		// The worker had closed the pooled connection: not its fault.
		h.opt.Logger.Debug("pooled connection closed by the worker; resending on a fresh one", "worker", lease.Worker, "err", err)
		t.res.StaleRetries = append(t.res.StaleRetries, lease.Worker)
		again := out.Clone(ctx)
		again.Body = io.NopCloser(bytes.NewReader(t.body))
		resp, err = h.fresh(again)
	}
	if err != nil {
		switch {
		case r.Context().Err() != nil: // the client left
		case errors.Is(context.Cause(t.ctx), errDrained):
			// Its worker's drain deadline passed before it answered: not
			// the worker's failure (serve places it again, attempt kept).
			err = errDrained
		default:
			h.report(lease.Worker, err)
		}
		return nil, fmt.Errorf("send to %s: %w", lease.Worker, err)
	}
	return resp, nil
}

// refused is the worker's failure to answer at all: a 5xx, or a
// continuation not answered with a stream (the client's headers are
// long sent, so any other answer is relayed as nothing).
func (h *Handler) refused(t *try, resp *http.Response, sse bool) error {
	if resp.StatusCode < 500 && (!t.cont() || resp.StatusCode < 300 && sse) {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	status := resp.Status
	if resp.StatusCode < 500 {
		status = "the continuation with " + status
	}
	err := fmt.Errorf("worker %s answered %s: %s", t.lease.Worker, status, strings.TrimSpace(string(msg)))
	h.report(t.lease.Worker, err)
	return err
}

// writeHeader sends the client the worker's status and headers, with
// Sluice's own.
func (h *Handler) writeHeader(t *try, resp *http.Response) {
	hdr := t.w.Header()
	copyHeader(hdr, resp.Header)
	hdr.Del("Content-Length") // the relay may end a broken stream early
	hdr.Set("X-Sluice-Worker", t.lease.Worker)
	hdr.Set("X-Sluice-Queue-Ms", strconv.FormatInt(t.lease.QueueWait.Milliseconds(), 10))
	if d := t.lease.Decision; d != nil {
		hdr.Set("X-Sluice-Decision", d.ID)
		if d.Attempt > 1 {
			hdr.Set("X-Sluice-Attempt", strconv.Itoa(d.Attempt))
		}
	}
	t.w.WriteHeader(resp.StatusCode)
	t.res.Status = resp.StatusCode
}

// ended classifies how an attempt the worker answered ended (st is the
// stream relayed, nil for a whole answer): it files what the relay
// measured in the Result, reports the outcome for health, and returns the
// observation of an answer that succeeded, or a stream's *streamBreak.
func (h *Handler) ended(t *try, status int, st *contStream, m measured, err error) (*stats.Observation, error) {
	res, cont := t.res, t.cont()
	res.Tokens = m.tokens
	if st != nil && st.resumable() {
		res.Tokens = st.emitted()
	}
	if m.ttft > 0 && !cont {
		// m.ttft runs from t.sent, on the monotonic clock as start:
		// the client's view adds everything before the attempt.
		res.WorkerTTFT = m.ttft
		res.TTFT = t.sent.Sub(t.start) + m.ttft
	}
	switch {
	case m.promptTokens > 0 && cont:
		res.PromptTokens = m.promptTokens - t.cs.carried
	case m.promptTokens > 0:
		res.PromptTokens = m.promptTokens
		h.ratio.observe(t.p, m.promptTokens) // also from a 400 that says the prompt was too long
	}
	var brk *streamBreak
	switch {
	case errors.Is(err, errClientGone) || (t.r.Context().Err() != nil && !m.complete):
		// The client left before the end; the worker did nothing wrong.
		// One that left after the end (closing at [DONE], say) had the
		// whole answer: that is a success, and teaches the averages.
		res.Status, res.Reason = 499, "client_gone"
	case errors.As(err, &brk):
		h.broke(t, brk)
		return nil, brk
	case err != nil: // a whole answer cut off
		h.report(t.lease.Worker, err)
		res.Reason = "upstream_failed"
		if errors.Is(err, ErrStreamIdle) {
			res.Reason = "stream_idle"
		}
		h.opt.Logger.Warn("worker failed mid-response", "worker", t.lease.Worker, "decision", decisionID(t.lease.Decision), "err", err)
	case status < 300:
		h.report(t.lease.Worker, nil)
		res.Reason = ""
		o := observation(m, time.Since(t.sent))
		if o.DecodeTPS > 0 {
			res.TPOT = time.Duration(float64(time.Second) / o.DecodeTPS)
		}
		return &o, nil
	}
	return nil, nil
}

// staleConn reports whether a request's failure before any answer may be
// a pooled connection the worker had closed: anything but a timeout or a
// cancellation, which say the worker was reached and was slow.
func staleConn(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// setAuth puts the worker's credentials in an outgoing request: its own
// key, else the client's Authorization only where the worker asks for it.
func (h *Handler) setAuth(hdr http.Header, worker string) {
	var key string
	var forward bool
	if h.opt.Credentials != nil {
		key, forward = h.opt.Credentials(worker)
	}
	switch {
	case key != "":
		hdr.Set("Authorization", "Bearer "+key)
		hdr.Del("X-Api-Key") // Anthropic clients' key header: the client's, not the worker's
	case !forward:
		hdr.Del("Authorization")
		hdr.Del("X-Api-Key")
	}
}

func (h *Handler) report(worker string, err error) {
	if h.opt.Reporter != nil {
		h.opt.Reporter.ReportRequest(worker, err)
	}
}

// observation turns what a relay measured of one answer into a sample for
// the averages. A stream shows its first token; a whole answer does not,
// so its time to first token and decode rate come from the worker's
// reported timings when it gave them: the first token came when decoding
// began, predicted_ms before the end (so worker-side queueing and the
// network count, as they do for a stream), or else after prompt_ms of
// prefill. Without timings a whole answer teaches end-to-end time and
// output length only.
func observation(m measured, e2e time.Duration) stats.Observation {
	o := stats.Observation{TTFT: m.ttft, E2E: e2e, OutputTokens: m.tokens, DecodeTPS: m.decodeTPS,
		CachedTokens: m.cachedTokens, CachedKnown: m.cachedKnown}
	if t := m.timings; t != nil {
		if o.TTFT == 0 {
			if d := msDuration(t.PredictedMs); d > 0 && d < e2e {
				o.TTFT = e2e - d
			} else if d := msDuration(t.PromptMs); d > 0 && d < e2e {
				o.TTFT = d
			}
		}
		if o.DecodeTPS == 0 {
			if t.PredictedPerSecond > 0 {
				o.DecodeTPS = t.PredictedPerSecond
			} else if t.PredictedN > 0 && t.PredictedMs > 0 {
				o.DecodeTPS = float64(t.PredictedN) / (t.PredictedMs / 1000)
			}
		}
	}
	if o.DecodeTPS == 0 && m.ttft > 0 && m.tokens > 1 && e2e > m.ttft {
		o.DecodeTPS = float64(m.tokens-1) / (e2e - m.ttft).Seconds()
	}
	return o
}

// msDuration converts a worker's millisecond figure; garbage becomes 0.
func msDuration(ms float64) time.Duration {
	if !(ms > 0) || ms > float64(365*24*time.Hour/time.Millisecond) {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// measured is what a relay learned of an answer.
type measured struct {
	ttft      time.Duration // first content of a stream; 0 for a whole answer
	tokens    int
	decodeTPS float64  // as reported by the worker, if it did
	timings   *timings // llama.cpp's timings of a whole answer, if given
	// promptTokens is the prompt length the worker reported in usage;
	// cachedTokens how many of them it found in its prefix cache, when
	// it said (cachedKnown).
	promptTokens int
	cachedTokens int
	cachedKnown  bool
	// complete is true when the client was given the whole answer: a
	// whole answer read to its end, a stream up to its terminator.
	complete bool
}

// errClientGone is what a relay returns when writing to the client
// failed: the client left, and nothing about the worker follows from it.
var errClientGone = errors.New("the client went away")

// relayBuffers holds the relays' read buffers: a stream's reads are
// small, and a buffer per request would be garbage per request.
var relayBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// maxParse bounds how much of a non-streamed answer is kept to read its
// usage and timings. The answer itself is relayed whole, however large.
const maxParse = 16 << 20

// relayWhole relays a non-streamed answer as it arrives and reads its
// usage and timings. It keeps at most limit bytes: the whole answer
// when it fits, else its last limit/2 bytes, where OpenAI-style servers
// put usage and llama.cpp its timings.
func relayWhole(w http.ResponseWriter, body io.Reader, limit int) (measured, error) {
	c := capture{limit: limit}
	bp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			c.Write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return measured{}, fmt.Errorf("%w: %v", errClientGone, werr)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return measured{}, fmt.Errorf("read answer: %w", err)
		}
	}
	var ch chunk
	out := measured{complete: true} // read to its end and written whole
	if c.parse(&ch) {
		out.tokens = ch.reportedTokens()
		out.timings = ch.Timings
		out.promptTokens = ch.promptCount()
		out.cachedTokens, out.cachedKnown = ch.cachedCount()
	}
	return out, nil
}

// capture keeps what relayWhole needs of an answer: all of it up to limit
// bytes; past that, a tail of limit/2 bytes.
type capture struct {
	limit int
	buf   []byte
	cut   bool // buf is a tail, not the whole answer
}

func (c *capture) Write(p []byte) {
	c.buf = append(c.buf, p...)
	if len(c.buf) > c.limit {
		keep := c.limit / 2
		c.buf = append(c.buf[:0], c.buf[len(c.buf)-keep:]...)
		c.cut = true
	}
}

// parse fills ch from the answer: by decoding it when it was kept whole,
// else by decoding the last "usage" and "timings" objects of its tail.
func (c *capture) parse(ch *chunk) bool {
	if !c.cut {
		// A field of another type than chunk's (an Anthropic answer's
		// "content" is an array of blocks) leaves the others decoded.
		var te *json.UnmarshalTypeError
		err := json.Unmarshal(c.buf, ch)
		return err == nil || errors.As(err, &te)
	}
	found := false
	for key, dst := range map[string]any{`"usage"`: &ch.Usage, `"timings"`: &ch.Timings} {
		i := bytes.LastIndex(c.buf, []byte(key))
		if i < 0 {
			continue
		}
		rest := bytes.TrimLeft(c.buf[i+len(key):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' && json.NewDecoder(bytes.NewReader(rest[1:])).Decode(dst) == nil {
			found = true
		}
	}
	return found
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append([]string(nil), vv...)
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
	// Headers named in Connection are hop-by-hop too.
	for _, f := range src["Connection"] {
		for _, name := range strings.Split(f, ",") {
			dst.Del(strings.TrimSpace(name))
		}
	}
}
