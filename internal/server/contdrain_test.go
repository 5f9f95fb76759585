package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/discovery"
	"github.com/sluice-router/sluice/internal/discovery/discoverytest"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// removalDrain is proxy.drain_deadline in the removal tests: what the
// router must arm when a worker leaves the fleet (the test's clock is
// steered, so its length costs nothing).
const removalDrain = 7 * time.Second

// removalIdle bounds how long a stall the drain failed to move holds a
// failing test (a moved one is held for milliseconds).
const removalIdle = 10 * time.Second

// drainBody is the stream the removal tests move: 40 tokens.
const drainBody = `{"model":"m","stream":true,"max_tokens":40,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`

// streamDuringRemoval streams drainBody through r with both sim workers
// set to stall their next stream at token 10 (their connection held open,
// removalIdle far off), so that whichever serves it is
// still writing the stream when it is removed; the other's stall is
// cleared once the serving one is known. At token 10 remove(served) runs;
// the test expects the router to arm proxy.drain_deadline for the removed
// worker (on s.after), fires it, and returns what the client read, and
// the worker that was removed.
func streamDuringRemoval(t *testing.T, r *router, ws []*simWorker, remove func(worker string)) (streamRead, string) {
	t.Helper()
	deadline := make(chan time.Time)
	asked := make(chan time.Duration, 1)
	r.srv.after = func(d time.Duration) <-chan time.Time { asked <- d; return deadline }
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	for _, w := range ws {
		w.srv.StallStreams(10, 1, release)
	}
	resp := postPath(t, context.Background(), r.url, "/v1/chat/completions", drainBody)
	served := resp.Header.Get("X-Sluice-Worker")
	for _, w := range ws {
		if w.name != served {
			w.srv.StallStreams(0, 0, nil) // the continuation's worker streams on
		}
	}
	got := readStream(t, resp, func(n int) {
		if n != 10 {
			return
		}
		remove(served)
		select {
		case d := <-asked:
			if d != removalDrain {
				t.Errorf("the removal armed a drain of %v, want proxy.drain_deadline %v", d, removalDrain)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the removal armed no drain deadline")
		}
		deadline <- time.Now()
	})
	return got, served
}

// movedIntact checks the stream moved from the removed worker at token
// 10, for the drain, and reads as uninterrupted.
func movedIntact(t *testing.T, r *router, got streamRead, removed string) {
	t.Helper()
	want, n, _ := sim.Reference("/v1/chat/completions", []byte(drainBody), contParams(4), "")
	if got.text != want || got.contents != n || got.completion != n || got.errorEvent != "" || !got.done || len(got.ids) != 1 || got.roles != 1 {
		t.Errorf("moved stream read %d tokens %q (usage %d, error %s, [DONE] %v, ids %v, %d roles), want %d: %q",
			got.contents, got.text, got.completion, got.errorEvent, got.done, got.ids, got.roles, n, want)
	}
	c, ok := continuationOf(r)
	if !ok || c.From != removed || c.Reason != "drain" || c.CarriedTokens != 10 || c.Outcome != "ok" {
		t.Errorf("continuation %+v (found %v), want from %s for drain, 10 carried, ok", c, ok, removed)
	}
}

// A config reload (what SIGHUP does) that drops a worker while it writes
// a stream arms proxy.drain_deadline for it; at the deadline the stream
// moves to the worker left and completes, reading as uninterrupted.
func TestContinuation_ReloadRemovingAWorkerMovesItsStream(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
	cfg := contConfig(t, ws, 4, func(c *config.Config) { c.Proxy.DrainDeadline, c.Proxy.StreamIdleTimeout = removalDrain, removalIdle })
	r := startRouter(t, cfg)
	got, removed := streamDuringRemoval(t, r, ws, func(worker string) {
		next := cfg
		next.Workers = nil
		for _, w := range cfg.Workers {
			if w.Name != worker {
				next.Workers = append(next.Workers, w)
			}
		}
		if err := r.srv.Reload(next); err != nil {
			t.Errorf("reload: %v", err)
		}
		if len(r.srv.Scheduler().Workers()) != 1 {
			t.Errorf("after the reload: %d workers, want 1", len(r.srv.Scheduler().Workers()))
		}
	})
	movedIntact(t, r, got, removed)
	idle(t, r)
}

// An EndpointSlice endpoint turning terminating (a pod going away) has
// discovery remove its worker, which arms proxy.drain_deadline; at the
// deadline the stream it still writes moves to the other discovered
// worker and completes, reading as uninterrupted. Discovery runs as
// `sluice serve` runs it (discovery.Watcher on the server's admin path),
// over client-go's fake EndpointSlices client.
func TestContinuation_TerminatingEndpointMovesItsStream(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
	kd := config.KubernetesDiscovery{Namespace: "inference", Selector: "kubernetes.io/service-name=sim",
		Kind: "llamacpp", Models: []string{"m"}, MaxConcurrency: 4}
	r := startRouter(t, testConfig(t, nil, func(c *config.Config) {
		c.Proxy.DrainDeadline, c.Proxy.StreamIdleTimeout = removalDrain, removalIdle
		c.Discovery.Kubernetes = &kd
	}))
	client := discoverytest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	slices := map[string]*discoveryv1.EndpointSlice{}
	for _, w := range ws {
		slices[w.name] = endpointSlice(t, w)
		if _, err := client.EndpointSlices("inference").Create(ctx, slices[w.name], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	watcher, err := discovery.New(kd, client, sinkOf{r.srv}, discovery.Options{Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.Run(ctx, nil); err != nil { // returns with the first set applied
		t.Fatal(err)
	}
	if n := len(r.srv.Scheduler().Workers()); n != 2 {
		t.Fatalf("discovered %d workers, want 2", n)
	}
	got, removed := streamDuringRemoval(t, r, ws, func(worker string) {
		s := slices[worker].DeepCopy()
		terminating := true
		s.Endpoints[0].Conditions.Terminating = &terminating
		if _, err := client.EndpointSlices("inference").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	})
	movedIntact(t, r, got, removed)
	idle(t, r)
	if n := len(r.srv.Scheduler().Workers()); n != 1 {
		t.Errorf("%d workers after the endpoint terminated, want 1", n)
	}
}

// sinkOf is the server's admin path as discovery's Sink, as `sluice
// serve` adapts it.
type sinkOf struct{ srv *Server }

func (s sinkOf) AddWorker(w config.Worker) error { return s.srv.AddWorker(w) }
func (s sinkOf) RemoveWorker(name string) error  { return s.srv.RemoveWorker(name) }
func (s sinkOf) WorkerNames() []string {
	var names []string
	for _, w := range s.srv.Scheduler().Workers() {
		names = append(names, w.Name)
	}
	return names
}

// endpointSlice is a slice of Service "sim" with w as its one ready
// endpoint, a pod named after the worker.
func endpointSlice(t *testing.T, w *simWorker) *discoveryv1.EndpointSlice {
	t.Helper()
	u, err := url.Parse(w.hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	p, ready := int32(port), true
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "sim-" + w.name, Namespace: "inference",
			Labels: map[string]string{discoveryv1.LabelServiceName: "sim"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: &p}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{u.Hostname()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: w.name, Namespace: "inference"}}},
	}
}

// holdingToolWorker is a llama.cpp worker (a sim, for its probes and
// every other request) whose chat stream with tools begins a tool call
// and then holds it until finish is closed, when it ends the call as
// llama-server does (finish_reason tool_calls, usage, [DONE]).
type holdingToolWorker struct {
	sim    *simWorker
	finish chan struct{}
}

func (w holdingToolWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.URL.Path != "/v1/chat/completions" || !bytes.Contains(body, []byte(`"tools"`)) {
		w.sim.ServeHTTP(rw, r)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	const id = `"id":"chatcmpl-tool","object":"chat.completion.chunk"`
	io.WriteString(rw, `data: {`+id+`,"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`+"\n\n")
	io.WriteString(rw, `data: {`+id+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":"}}]}}]}`+"\n\n")
	rw.(http.Flusher).Flush()
	select {
	case <-w.finish:
	case <-r.Context().Done():
		return
	}
	io.WriteString(rw, `data: {`+id+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]}}]}`+"\n\n")
	io.WriteString(rw, `data: {`+id+`,"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}`+"\n\n")
	io.WriteString(rw, "data: [DONE]\n\n")
}

// A drain deadline moves only the streams that can go on elsewhere: a
// stream on the drained worker whose tool call began (which no worker
// can be asked to continue) is left to finish there, as the drain
// promises, while a plain stream on the same worker is moved. The tool
// call's stream starts first, so the deadline comes to it before the
// plain one (streams are moved in the order they started): by the time
// the moved stream has ended, the tool call's fate at the deadline is
// settled, and only then is its worker let finish.
func TestContinuation_DrainLeavesAStreamThatCannotMove(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
	// w0 is a sim behind holdingToolWorker, a handler of its own from the start.
	srv, err := sim.NewServer(contParams(4), sim.Options{TimeScale: 200, Name: "w0"})
	if err != nil {
		t.Fatal(err)
	}
	finish := make(chan struct{})
	ws[0] = &simWorker{name: "w0", kind: "llamacpp", srv: srv}
	ws[0].hs = httptest.NewServer(holdingToolWorker{ws[0], finish})
	t.Cleanup(func() {
		srv.Close()
		ws[0].hs.Close()
	})
	<-srv.Ready()
	// Only w0 at first, so that both streams start there; w1 joins
	// before the deadline, to take the plain one.
	r := startRouter(t, contConfig(t, ws[:1], 4, func(c *config.Config) { c.Proxy.StreamIdleTimeout = removalIdle }))
	deadline := make(chan time.Time)
	r.srv.after = func(time.Duration) <-chan time.Time { return deadline }

	tool := postPath(t, context.Background(), r.url, "/v1/chat/completions",
		`{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"weather"}}],"messages":[{"role":"user","content":"weather in Oslo?"}]}`)
	sawTool, toolRead := make(chan struct{}), make(chan string)
	go func(saw chan struct{}) {
		defer tool.Body.Close()
		var all strings.Builder
		br := bufio.NewReader(tool.Body)
		for {
			line, err := br.ReadString('\n')
			all.WriteString(line)
			if strings.Contains(line, `"tool_calls"`) && saw != nil {
				close(saw) // the router relayed it, having followed it
				saw = nil
			}
			if err != nil {
				toolRead <- all.String()
				return
			}
		}
	}(sawTool)
	<-sawTool

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	ws[0].srv.StallStreams(10, 1, release)
	plain := postPath(t, context.Background(), r.url, "/v1/chat/completions", drainBody)
	if w := plain.Header.Get("X-Sluice-Worker"); w != "w0" {
		t.Fatalf("the plain stream went to %q, want w0", w)
	}
	got := readStream(t, plain, func(n int) {
		if n != 10 {
			return
		}
		if err := r.srv.AddWorker(config.Worker{Name: "w1", URL: ws[1].hs.URL, Kind: "llamacpp", Models: []string{"m"}, MaxConcurrency: 4}); err != nil {
			t.Fatal(err)
		}
		resp := postPath(t, context.Background(), r.url, "/api/workers/w0/drain?deadline=30s", "")
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("drain: %d %s", resp.StatusCode, b)
		}
		deadline <- time.Now()
	})
	movedIntact(t, r, got, "w0")
	close(finish)
	raw := <-toolRead
	if !strings.Contains(raw, `"finish_reason":"tool_calls"`) || !strings.HasSuffix(raw, "data: [DONE]\n\n") || strings.Contains(raw, `"error"`) {
		t.Errorf("the tool call's stream read %q; want it finished on w0, [DONE], no error", raw)
	}
	idle(t, r)
}

// A drain deadline that passes while a stream's request still waits for
// its worker's answer moves it as it moves a stream: the request is
// placed on another worker and completes, the drained worker is not
// blamed, and the move does not use up proxy.max_attempts (1 here, so a
// counted attempt would leave the client a 502).
func TestContinuation_DrainBeforeTheAnswerPlacesTheRequestAgain(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
	r := startRouter(t, contConfig(t, ws, 4, func(c *config.Config) { c.Proxy.MaxAttempts = 1 }))
	deadline := make(chan time.Time)
	r.srv.after = func(d time.Duration) <-chan time.Time {
		if d == 2*time.Second {
			return deadline
		}
		return time.After(d)
	}
	held := make(chan string, 2)
	for _, w := range ws {
		w.hold.Store(&held)
	}
	got := make(chan streamRead, 1)
	go func() {
		got <- readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", drainBody), nil)
	}()
	holder := <-held
	for _, w := range ws {
		w.hold.Store(nil) // the request's next worker answers
	}
	resp := postPath(t, context.Background(), r.url, "/api/workers/"+holder+"/drain?deadline=2s", "")
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("drain: %d %s", resp.StatusCode, b)
	}
	close(deadline)
	read := <-got
	want, n, _ := sim.Reference("/v1/chat/completions", []byte(drainBody), contParams(4), "")
	if read.status != http.StatusOK || read.text != want || read.completion != n || !read.done {
		t.Fatalf("after the drain of %s: status %d, %d tokens, [DONE] %v, other lines %q; want the whole answer from the other worker", holder, read.status, read.contents, read.done, read.other)
	}
	if read.worker == holder {
		t.Errorf("served by %s, the drained worker", read.worker)
	}
	for _, w := range r.srv.Scheduler().Workers() {
		if w.Health != snapshot.HealthOK {
			t.Errorf("%s is %v after the drain, want healthy: a drain is no failure", w.Name, w.Health)
		}
	}
}
