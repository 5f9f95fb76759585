package proxy

import (
	"context"
	"net/http"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// Tracer follows requests through the proxy, one span each; the tracing
// package implements it with OpenTelemetry. A nil Options.Tracer costs
// nothing.
type Tracer interface {
	// Start begins the span of an inbound request; the returned context
	// carries it to the attempts.
	Start(ctx context.Context, r *http.Request) (context.Context, Span)
}

// Span is one request's span.
type Span interface {
	// Attempt records the lease an attempt runs on (worker, queue wait,
	// decision and its terms) and puts the trace context in the headers
	// sent to the worker.
	Attempt(ctx context.Context, lease *scheduler.Lease, out http.Header)
	// End closes the span with the request's result.
	End(res Result)
}

type spanKey struct{}

// spanFrom returns the span Start put in ctx, or nil.
func spanFrom(ctx context.Context) Span {
	s, _ := ctx.Value(spanKey{}).(Span)
	return s
}

// startSpan begins the request's span when a Tracer is set; end is never
// nil.
func (h *Handler) startSpan(r *http.Request) (*http.Request, func(*Result)) {
	if h.opt.Tracer == nil {
		return r, func(*Result) {}
	}
	ctx, span := h.opt.Tracer.Start(r.Context(), r)
	ctx = context.WithValue(ctx, spanKey{}, span)
	return r.WithContext(ctx), func(res *Result) { span.End(*res) }
}
