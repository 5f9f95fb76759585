package server

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// holdStream starts a streamed request that worker f holds once it has
// arrived there, and returns a func that lets it go and returns the body
// the client read.
func holdStream(t *testing.T, r *router, f *fakeWorker) (finish func() string) {
	t.Helper()
	f.hold, f.arrived = make(chan struct{}), make(chan string, 1)
	body := make(chan string, 1)
	go func() {
		resp, err := httpPost(r.url, chat("held", true))
		if err != nil {
			body <- "error: " + err.Error()
			return
		}
		body <- readAllOrErr(resp)
	}()
	<-f.arrived
	return func() string {
		close(f.hold)
		return <-body
	}
}

// workerSeries lists the lines of /metrics whose worker label is name.
func workerSeries(t *testing.T, r *router, name string) []string {
	t.Helper()
	resp, err := httpGet(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.Lines(readAll(t, resp)) {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, `worker="`+name+`"`) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// hostTransports counts the transports the router keeps for u's host.
func hostTransports(s *Server, u string) int {
	p, _ := url.Parse(u)
	_, ok := s.transport.byHost.Load(p.Scheme + "://" + p.Host)
	if ok {
		return 1
	}
	return 0
}

// A removed worker keeps what its streams still running need — its URL,
// credentials and kind — and when the last of them ends, the router
// forgets it: nothing resolves under its name, its host's transport is
// gone and /metrics has no series of it left, even those its last
// stream's result added after the removal.
func TestWorkerLife_RemovedWorkerIsForgottenWhenItsLastStreamEnds(t *testing.T) {
	w0, w1 := newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")
	r := startRouter(t, testConfig(t, []*fakeWorker{w0, w1}, func(c *config.Config) {
		c.Workers[1].APIKey = "key-1"
		c.Workers[1].Kind = "vllm"
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	}))
	if code, _ := adminDo(t, r, "POST", "/api/workers/gpu0/drain"); code != 200 {
		t.Fatalf("drain gpu0: %d", code)
	}
	finish := holdStream(t, r, w1)
	if err := r.srv.RemoveWorker("gpu1"); err != nil {
		t.Fatal(err)
	}
	if u, ok := r.srv.resolve("gpu1"); !ok || u.String() != w1.srv.URL {
		t.Errorf("while its stream runs, gpu1 resolves to %v, %v; want %s", u, ok, w1.srv.URL)
	}
	if key, _ := r.srv.credentials("gpu1"); key != "key-1" {
		t.Errorf("while its stream runs, gpu1's key is %q", key)
	}
	if k := r.srv.kindOf("gpu1"); k != "vllm" {
		t.Errorf("while its stream runs, gpu1's kind is %q", k)
	}
	if body := finish(); !strings.Contains(body, "[DONE]") {
		t.Fatalf("the stream running on the removed worker did not end whole:\n%s", body)
	}
	if u, ok := r.srv.resolve("gpu1"); ok {
		t.Errorf("gpu1 still resolves to %v after its last stream", u)
	}
	if key, fwd := r.srv.credentials("gpu1"); key != "" || fwd {
		t.Errorf("gpu1's credentials outlive it: %q, %v", key, fwd)
	}
	if k := r.srv.kindOf("gpu1"); k != "" {
		t.Errorf("gpu1's kind outlives it: %q", k)
	}
	if n := hostTransports(r.srv, w1.srv.URL); n != 0 {
		t.Errorf("gpu1's host keeps its transport")
	}
	if n := hostTransports(r.srv, w0.srv.URL); n != 1 {
		t.Errorf("gpu0's host lost its transport")
	}
	if s := workerSeries(t, r, "gpu1"); len(s) > 0 {
		t.Errorf("/metrics keeps series of the removed gpu1:\n%s", strings.Join(s, "\n"))
	}
	if r.srv.pendingDrains() != 0 {
		t.Errorf("a drain deadline outlives the worker")
	}

	// Added again under its name, at another address with another key:
	// nothing of the old life answers for it.
	w2 := newFakeWorker(t, "gpu1")
	if err := r.srv.AddWorker(config.Worker{Name: "gpu1", URL: w2.srv.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	if u, ok := r.srv.resolve("gpu1"); !ok || u.String() != w2.srv.URL {
		t.Errorf("gpu1 added again resolves to %v, %v; want %s", u, ok, w2.srv.URL)
	}
	if key, _ := r.srv.credentials("gpu1"); key != "" {
		t.Errorf("gpu1 added again without a key sends the old one %q", key)
	}
	if k := r.srv.kindOf("gpu1"); k != "openai" {
		t.Errorf("gpu1 added again has kind %q", k)
	}
}

// A worker removed and added again while a stream of its last life still
// runs is one life, as in the scheduler: the stream ends whole, its end
// does not tear down the worker added since, and what the old address
// needed goes.
func TestWorkerLife_ReAddedWhileItsStreamRunsKeepsTheNewLife(t *testing.T) {
	w0, w1, w2 := newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1"), newFakeWorker(t, "gpu1")
	r := startRouter(t, testConfig(t, []*fakeWorker{w0, w1}, nil))
	if code, _ := adminDo(t, r, "POST", "/api/workers/gpu0/drain"); code != 200 {
		t.Fatalf("drain gpu0: %d", code)
	}
	finish := holdStream(t, r, w1)
	if err := r.srv.RemoveWorker("gpu1"); err != nil {
		t.Fatal(err)
	}
	if err := r.srv.AddWorker(config.Worker{Name: "gpu1", URL: w2.srv.URL, Kind: "openai", Models: []string{"m"}, MaxConcurrency: 2, APIKey: "key-2"}); err != nil {
		t.Fatal(err)
	}
	if body := finish(); !strings.Contains(body, "[DONE]") {
		t.Fatalf("the stream of the worker's last life did not end whole:\n%s", body)
	}
	if u, ok := r.srv.resolve("gpu1"); !ok || u.String() != w2.srv.URL {
		t.Errorf("after the old life's stream ended, gpu1 resolves to %v, %v; want %s", u, ok, w2.srv.URL)
	}
	if key, _ := r.srv.credentials("gpu1"); key != "key-2" {
		t.Errorf("after the old life's stream ended, gpu1's key is %q", key)
	}
	if n := hostTransports(r.srv, w2.srv.URL); n != 1 {
		t.Errorf("gpu1's new host has no transport")
	}
	if n := hostTransports(r.srv, w1.srv.URL); n != 0 {
		t.Errorf("gpu1's old host keeps its transport")
	}
	if s := workerSeries(t, r, "gpu1"); len(s) == 0 {
		t.Errorf("the series of gpu1, present again, were deleted")
	}
	resp := post(t, context.Background(), r.url, chat("after", false))
	if got := resp.Header.Get("X-Sluice-Worker"); got != "gpu1" || readAll(t, resp) == "" {
		t.Errorf("served by %q after gpu1 came back", got)
	}

	// A reload that moves the worker to another address drops the old
	// address's transport too.
	w3 := newFakeWorker(t, "gpu1")
	next := testConfig(t, []*fakeWorker{w0, w3}, nil)
	if err := r.srv.Reload(next); err != nil {
		t.Fatal(err)
	}
	if n := hostTransports(r.srv, w2.srv.URL); n != 0 {
		t.Errorf("a reload moved gpu1, and its old host keeps its transport")
	}
	// A reload that drops it, with nothing running there, forgets it at once.
	if err := r.srv.Reload(testConfig(t, []*fakeWorker{w0}, nil)); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.srv.resolve("gpu1"); ok || hostTransports(r.srv, w3.srv.URL) != 0 {
		t.Errorf("a reload dropped the idle gpu1, and the router still knows it")
	}
}

// pendingDrains counts the drain deadlines the router holds.
func (s *Server) pendingDrains() int {
	s.members.mu.RLock()
	defer s.members.mu.RUnlock()
	n := 0
	for _, m := range s.members.all {
		if m.drain != nil {
			n++
		}
	}
	return n
}

func httpPost(base, body string) (*http.Response, error) {
	return http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
}

func httpGet(u string) (*http.Response, error) { return http.Get(u) }

func readAllOrErr(resp *http.Response) string {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return string(b) + "\nerror: " + err.Error()
	}
	return string(b)
}

func adminDo(t *testing.T, r *router, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, r.url+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}
