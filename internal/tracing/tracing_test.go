package tracing

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/server"
)

// worker answers chat completions and remembers the traceparent it got.
type worker struct {
	srv *httptest.Server
	mu  sync.Mutex
	tp  string
}

func newWorker(t *testing.T) *worker {
	w := &worker{}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(rw, `{"object":"list","data":[{"id":"m"}]}`)
			return
		}
		w.mu.Lock()
		w.tp = r.Header.Get("traceparent")
		w.mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func router(t *testing.T, wk *worker, tr *Tracer) string {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: wk.srv.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(cfg, server.Options{Logger: slog.New(slog.DiscardHandler), Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	return hs.URL
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracer_OneSpanPerRequestWithTheDecision(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	wk := newWorker(t)
	url := router(t, wk, New(tp))

	// The client's own trace: Sluice's span must be its child.
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "POST /v1/chat/completions" || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if got := s.SpanContext().TraceID().String(); got != clientTrace {
		t.Errorf("trace id %s, want the client's %s", got, clientTrace)
	}
	if got := s.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("parent span %s, want the client's", got)
	}
	a := attrs(s)
	if a[AttrWorker].AsString() != "gpu0" || a[AttrModel].AsString() != "m" {
		t.Errorf("worker/model attributes: %v", a)
	}
	if id := a[AttrDecision].AsString(); id == "" || id != resp.Header.Get("X-Sluice-Decision") {
		t.Errorf("decision id %q, header %q", id, resp.Header.Get("X-Sluice-Decision"))
	}
	if _, ok := a[AttrQueueWaitMs]; !ok {
		t.Error("no queue wait attribute")
	}
	if _, ok := a[AttrScoreTotal]; !ok {
		t.Errorf("no score total: %v", a)
	}
	terms := 0
	for k := range a {
		if strings.HasPrefix(string(k), AttrTermPrefix) && k != AttrScoreTotal {
			terms++
		}
	}
	if terms == 0 {
		t.Errorf("no score terms among %v", a)
	}
	if got := a["http.response.status_code"].AsInt64(); got != 200 {
		t.Errorf("status attribute %d", got)
	}

	// The worker got Sluice's span as parent, in the same trace.
	wk.mu.Lock()
	tp2 := wk.tp
	wk.mu.Unlock()
	want := "00-" + clientTrace + "-" + s.SpanContext().SpanID().String() + "-01"
	if tp2 != want {
		t.Errorf("worker traceparent %q, want %q", tp2, want)
	}
}

func TestTracer_RefusalIsAnErrorSpanWithoutAttempt(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	url := router(t, newWorker(t), New(tp))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	a := attrs(spans[0])
	if a[AttrReason].AsString() != "model_not_found" || a["http.response.status_code"].AsInt64() != 404 {
		t.Errorf("attributes %v", a)
	}
	if _, ok := a[AttrWorker]; ok {
		t.Error("a refused request has a worker attribute")
	}
}

func TestNewOTLP_RejectsBadEndpoint(t *testing.T) {
	if _, err := NewOTLP(context.Background(), "collector:4318", "sluice", 1); err == nil || !strings.Contains(err.Error(), "tracing.otlp_endpoint") {
		t.Errorf("err %v", err)
	}
	p, err := NewOTLP(context.Background(), "http://127.0.0.1:4318", "sluice", 1)
	if err != nil {
		t.Fatal(err)
	}
	p.Shutdown(context.Background())
}
