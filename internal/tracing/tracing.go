// Package tracing gives Sluice OpenTelemetry traces: one span per proxied
// request, with the queue wait, the decision id, the chosen worker and the
// chosen worker's score terms as attributes, and the W3C trace context
// (traceparent) passed on to the worker so its own spans join the trace.
// Spans go to an OTLP/HTTP collector when tracing.otlp_endpoint is set;
// without it nothing is created and the proxy's hook stays nil.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// Attribute keys Sluice sets on a request's span.
const (
	AttrModel       = "sluice.model"
	AttrWorker      = "sluice.worker"
	AttrDecision    = "sluice.decision_id"
	AttrQueueWaitMs = "sluice.queue_wait_ms"
	AttrAttempt     = "sluice.attempt"
	AttrAttempts    = "sluice.attempts"
	AttrReason      = "sluice.reason"
	AttrPrompt      = "sluice.prompt_tokens"
	AttrTokens      = "sluice.completion_tokens"
	AttrScoreTotal  = "sluice.score.total"
	// AttrTermPrefix starts one attribute per score term of the chosen
	// worker: sluice.score.<term> is the term's weighted value.
	AttrTermPrefix = "sluice.score."
)

// Tracer implements proxy.Tracer with an OpenTelemetry tracer.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracer that starts spans with tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		tracer: tp.Tracer("github.com/sluice-router/sluice/internal/tracing"),
		prop:   propagation.TraceContext{},
	}
}

// Start begins a server span for r, as a child of the client's trace when
// its request carries a traceparent.
func (t *Tracer) Start(ctx context.Context, r *http.Request) (context.Context, proxy.Span) {
	ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
	ctx, span := t.tracer.Start(ctx, r.Method+" "+r.URL.Path,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
	return ctx, &span_{span: span, prop: t.prop}
}

// span_ is one request's span.
type span_ struct {
	span trace.Span
	prop propagation.TextMapPropagator
}

// Attempt records the lease and injects traceparent into out.
func (s *span_) Attempt(ctx context.Context, lease *scheduler.Lease, out http.Header) {
	if s.span.IsRecording() {
		s.record(lease)
	}
	out.Del("traceparent")
	out.Del("tracestate")
	s.prop.Inject(trace.ContextWithSpan(ctx, s.span), propagation.HeaderCarrier(out))
}

// record sets the lease's attributes. The decision's per-term breakdown
// is built on demand (Explain), so an unsampled span costs nothing.
func (s *span_) record(lease *scheduler.Lease) {
	attrs := []attribute.KeyValue{
		attribute.String(AttrWorker, lease.Worker),
		attribute.Float64(AttrQueueWaitMs, float64(lease.QueueWait.Microseconds())/1000),
	}
	if d := lease.Decision; d != nil {
		attrs = append(attrs, attribute.String(AttrDecision, d.ID), attribute.Int(AttrAttempt, d.Attempt))
		for _, c := range d.Explain().Candidates {
			if c.Worker != lease.Worker {
				continue
			}
			attrs = append(attrs, attribute.Float64(AttrScoreTotal, c.Total))
			for _, term := range c.Terms {
				attrs = append(attrs, attribute.Float64(AttrTermPrefix+term.Name, term.Weighted))
			}
		}
	}
	s.span.SetAttributes(attrs...)
	s.span.AddEvent("attempt", trace.WithAttributes(attribute.String(AttrWorker, lease.Worker)))
}

// End sets the result's attributes and status and ends the span.
func (s *span_) End(res proxy.Result) {
	s.span.SetAttributes(
		semconv.HTTPResponseStatusCode(res.Status),
		attribute.String(AttrModel, res.Model),
		attribute.Int(AttrAttempts, res.Attempts),
		attribute.Int(AttrPrompt, res.PromptTokens),
		attribute.Int(AttrTokens, res.Tokens),
	)
	if res.Reason != "" {
		s.span.SetAttributes(attribute.String(AttrReason, res.Reason))
	}
	if res.Status >= 500 {
		s.span.SetStatus(codes.Error, res.Reason)
	}
	s.span.End()
}

// Provider is an SDK tracer provider exporting to an OTLP/HTTP collector.
type Provider struct {
	*sdktrace.TracerProvider
}

// NewOTLP returns a provider that batches spans to endpoint, an OTLP/HTTP
// collector's base URL such as http://otel-collector:4318 (spans go to
// /v1/traces below it). sampleRatio in (0, 1] samples that share of new
// traces; a request whose client sampled its trace is always recorded.
func NewOTLP(ctx context.Context, endpoint, serviceName string, sampleRatio float64) (*Provider, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing.otlp_endpoint: %q is not an http(s) URL", endpoint)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(strings.TrimRight(endpoint, "/") + "/v1/traces")}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(serviceName))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(sampleRatio))),
	)
	return &Provider{tp}, nil
}
