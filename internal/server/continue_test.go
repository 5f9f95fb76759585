package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// simWorker is a simulated worker on loopback that a test can kill (its
// connections cut, new ones closed at once, as a crashed process's) and
// restart.
type simWorker struct {
	name, kind string
	srv        *sim.Server
	hs         *httptest.Server
	down       atomic.Bool
	// hold, when set, is sent the worker's name by each chat request,
	// which then goes unanswered, no header written, until the router
	// gives it up. (The body is read first: net/http notices a closed
	// connection, and cancels the request's context, only once the body
	// has been read.)
	hold atomic.Pointer[chan string]
}

func (w *simWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if h := w.hold.Load(); h != nil && r.URL.Path == "/v1/chat/completions" {
		io.Copy(io.Discard, r.Body)
		*h <- w.name
		<-r.Context().Done()
		return
	}
	if w.down.Load() {
		if c, _, err := http.NewResponseController(rw).Hijack(); err == nil {
			c.Close()
		}
		return
	}
	w.srv.ServeHTTP(rw, r)
}

// kill cuts every connection and refuses new requests until restart.
func (w *simWorker) kill() {
	w.down.Store(true)
	w.hs.CloseClientConnections()
}

func (w *simWorker) restart() { w.down.Store(false) }

// contParams are the simulated workers' engine: no interference, so that
// timings are the model's, natural lengths of 20 to 60 tokens.
func contParams(slots int) sim.Params {
	p := sim.DefaultParams()
	p.Model = "m"
	p.Slots = slots
	p.InterferenceScale = 0
	p.OutputMedian, p.OutputSigma, p.OutputMin, p.OutputMax = 30, 0.4, 20, 60
	return p
}

// startSimWorkers starts one simulated worker per kind ("vllm" and
// "sglang" emulate vLLM's continuation; others llama-server's).
func startSimWorkers(t *testing.T, p sim.Params, scale float64, kinds ...string) []*simWorker {
	t.Helper()
	var out []*simWorker
	for i, k := range kinds {
		emulate := ""
		if k == "vllm" || k == "sglang" {
			emulate = k
		}
		srv, err := sim.NewServer(p, sim.Options{TimeScale: scale, Name: fmt.Sprintf("w%d", i), Emulate: emulate})
		if err != nil {
			t.Fatal(err)
		}
		w := &simWorker{name: fmt.Sprintf("w%d", i), kind: k, srv: srv}
		w.hs = httptest.NewServer(w)
		t.Cleanup(func() {
			srv.Close()
			w.hs.Close()
		})
		<-srv.Ready()
		out = append(out, w)
	}
	return out
}

// contConfig is a router in front of ws, each serving model m with room
// for slots streams.
func contConfig(t *testing.T, ws []*simWorker, slots int, edit func(*config.Config)) config.Config {
	return testConfig(t, nil, func(c *config.Config) {
		for _, w := range ws {
			c.Workers = append(c.Workers, config.Worker{Name: w.name, URL: w.hs.URL, Kind: w.kind, Models: []string{"m"}, MaxConcurrency: config.Concurrency(slots)})
		}
		if edit != nil {
			edit(c)
		}
	})
}

// streamRead is what a client read of one stream.
type streamRead struct {
	text                string
	ids                 map[string]bool
	roles, contents     int
	prompt, completion  int
	done, stop          bool
	errorEvent          string
	worker, decisionIDs string
	tokenTimes          []time.Time
	// status is the response's; other holds the lines that were not
	// events (an error answer's body), for a failure to show.
	status int
	other  []string
}

// readStream reads a streamed answer of any of the three shapes; onToken,
// if not nil, is called with the count after each content event.
func readStream(t *testing.T, resp *http.Response, onToken func(n int)) streamRead {
	t.Helper()
	defer resp.Body.Close()
	out := streamRead{ids: map[string]bool{}, worker: resp.Header.Get("X-Sluice-Worker"), decisionIDs: resp.Header.Get("X-Sluice-Decision"), status: resp.StatusCode}
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			if l := sc.Text(); l != "" && len(out.other) < 4 {
				out.other = append(out.other, l)
			}
			continue
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Role    *string `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				Text *string `json:"text"`
			} `json:"choices"`
			Content         *string         `json:"content"`
			Stop            bool            `json:"stop"`
			TokensPredicted int             `json:"tokens_predicted"`
			TokensEvaluated int             `json:"tokens_evaluated"`
			Error           json.RawMessage `json:"error"`
			Usage           *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Errorf("event that is not JSON: %q", data)
			continue
		}
		if len(c.Error) > 0 {
			out.errorEvent = string(c.Error)
			continue
		}
		if c.ID != "" {
			out.ids[c.ID] = true
		}
		text := ""
		if c.Content != nil {
			text = *c.Content
		}
		for _, ch := range c.Choices {
			if ch.Delta.Role != nil {
				out.roles++
			}
			if ch.Delta.Content != nil {
				text += *ch.Delta.Content
			}
			if ch.Text != nil {
				text += *ch.Text
			}
		}
		if text != "" {
			sb.WriteString(text)
			out.contents++
			out.tokenTimes = append(out.tokenTimes, time.Now())
			if onToken != nil {
				onToken(out.contents)
			}
		}
		if c.Usage != nil {
			out.prompt, out.completion = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
				t.Errorf("usage total %d is not prompt %d + completion %d", c.Usage.TotalTokens, c.Usage.PromptTokens, c.Usage.CompletionTokens)
			}
		}
		if c.Stop {
			out.stop = true
			out.prompt, out.completion = c.TokensEvaluated, c.TokensPredicted
		}
	}
	out.text = sb.String()
	return out
}

// postPath posts body to path with extra headers (name, value pairs).
func postPath(t *testing.T, ctx context.Context, url, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// idle checks that no lease is left held on any worker of r.
func idle(t *testing.T, r *router) {
	t.Helper()
	for _, ws := range r.srv.Scheduler().Workers() {
		if ws.Active != 0 {
			t.Errorf("worker %s has %d requests in flight after every stream ended", ws.Name, ws.Active)
		}
	}
}

// contForms are the requests each kind that can continue a stream is
// asked, with the kind of its two workers.
var contForms = []struct {
	name, kind, path, body string
}{
	{"llama.cpp chat", "llamacpp", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"system","content":"brief"},{"role":"user","content":"tell me about GPUs"}]}`},
	{"vLLM chat", "vllm", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"tell me about GPUs"}]}`},
	{"vLLM /v1/completions", "vllm", "/v1/completions", `{"model":"m","stream":true,"prompt":"Once upon a time"}`},
	{"llama.cpp /completion", "llamacpp", "/completion", `{"stream":true,"prompt":"Once upon a time","n_predict":40,"ignore_eos":true}`},
	{"llama.cpp chat, max_tokens", "llamacpp", "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":30,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`},
}

// For each engine kind that can continue a stream: a stream whose worker
// dies at token k — the first token (with the role), the second, the
// middle, the one before the last and the last — reads exactly as the
// uninterrupted stream: the same text, the same usage, one id, one role,
// no error; the continuation's record says from where, why and how much
// was carried; no lease is left held.
func TestContinuation_KilledWorkerReadsAsUninterrupted(t *testing.T) {
	for _, f := range contForms {
		t.Run(f.name, func(t *testing.T) {
			ws := startSimWorkers(t, contParams(4), 200, f.kind, f.kind)
			ref := readStream(t, postPath(t, context.Background(), startRouter(t, contConfig(t, ws, 4, nil)).url, f.path, f.body), nil)
			want, n, err := sim.Reference(f.path, []byte(f.body), contParams(4), emulateOf(f.kind))
			if err != nil || ref.text != want || ref.contents != n || ref.completion != n || ref.errorEvent != "" {
				t.Fatalf("uninterrupted stream: %d tokens %q (usage %d, error %s), want %d: %q", ref.contents, ref.text, ref.completion, ref.errorEvent, n, want)
			}
			for _, k := range []int{1, 2, n / 2, n - 1, n} {
				r := startRouter(t, contConfig(t, ws, 4, nil)) // fresh: the first worker listed serves first
				ws[0].srv.AbortStreams(k, 1)
				got := readStream(t, postPath(t, context.Background(), r.url, f.path, f.body), nil)
				if got.text != ref.text || got.errorEvent != "" {
					t.Errorf("k=%d: read %q (error %s), want %q", k, got.text, got.errorEvent, ref.text)
				}
				if got.prompt != ref.prompt || got.completion != ref.completion {
					t.Errorf("k=%d: usage prompt %d completion %d, want %d and %d", k, got.prompt, got.completion, ref.prompt, ref.completion)
				}
				if len(got.ids) > 1 || got.roles > 1 || got.done != ref.done || got.stop != ref.stop {
					t.Errorf("k=%d: ids %v, %d role chunks, [DONE] %v stop %v; want one id, one role, as uninterrupted", k, got.ids, got.roles, got.done, got.stop)
				}
				c, ok := continuationOf(r)
				if !ok || c.From != "w0" || c.CarriedTokens != k || c.Outcome != "ok" || c.Reason != "upstream_failed" {
					t.Errorf("k=%d: record's continuation %+v (found %v), want from w0, %d carried, upstream_failed, ok", k, c, ok, k)
				}
				idle(t, r)
			}
		})
	}
}

// emulateOf is the sim's Emulate for a worker kind.
func emulateOf(kind string) string {
	if kind == "vllm" || kind == "sglang" {
		return kind
	}
	return ""
}

// continuationOf returns the continuation on r's latest decision that has one.
func continuationOf(r *router) (c struct {
	From, Reason, Outcome string
	CarriedTokens         int
	GapMs                 float64
}, ok bool) {
	for _, rec := range r.srv.Decisions().Recent(50) {
		if x, found := rec.Continuation(); found {
			c.From, c.Reason, c.Outcome, c.CarriedTokens, c.GapMs = x.From, x.Reason, x.Outcome, x.CarriedTokens, x.GapMs
			return c, true
		}
	}
	return c, false
}

// A continuation that fails too ends the stream with the error event and
// frees everything; a worker kind that cannot continue is never chosen
// for it; X-Sluice-Continue: off, a key with continue: false and n > 1
// turn it off; any other X-Sluice-Continue is a 400.
func TestContinuation_WhenItDoesNotHappen(t *testing.T) {
	body := `{"model":"m","stream":true,"max_tokens":30,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`
	broken := func(t *testing.T, got streamRead, r *router) {
		t.Helper()
		if !strings.Contains(got.errorEvent, "upstream_failed") || got.done {
			t.Errorf("stream ended with error %q, [DONE] %v; want Sluice's upstream_failed event and no [DONE]", got.errorEvent, got.done)
		}
		idle(t, r)
	}
	t.Run("the continuation fails too", func(t *testing.T) {
		ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
		r := startRouter(t, contConfig(t, ws, 4, nil))
		ws[0].srv.AbortStreams(5, 1)
		ws[1].srv.AbortStreams(3, 1)
		got := readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", body), nil)
		broken(t, got, r)
		if got.contents != 8 {
			t.Errorf("read %d tokens before the error, want 5 + 3", got.contents)
		}
		if c, ok := continuationOf(r); !ok || c.Outcome != "failed" {
			t.Errorf("record's continuation %+v, want outcome failed", c)
		}
	})
	t.Run("a kind that cannot continue is never chosen", func(t *testing.T) {
		ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "tgi")
		r := startRouter(t, contConfig(t, ws, 4, nil))
		ws[0].srv.AbortStreams(5, 1)
		broken(t, readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", body), nil), r)
		if m := ws[1].srv.Metrics(); m.Finished+m.Cancelled+int64(m.RequestsProcessing) != 0 {
			t.Errorf("the tgi worker was sent a continuation: %+v", m)
		}
	})
	for _, tc := range []struct {
		name     string
		body     string
		hdr      []string
		noKeyCon bool
	}{
		{"X-Sluice-Continue: off", body, []string{"X-Sluice-Continue", "off"}, false},
		{"n > 1", strings.Replace(body, `"stream"`, `"n":2,"stream"`, 1), nil, false},
		{"the key says continue: false", body, []string{"Authorization", "Bearer k-nocont"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := startSimWorkers(t, contParams(4), 200, "llamacpp", "llamacpp")
			r := startRouter(t, contConfig(t, ws, 4, func(c *config.Config) {
				if tc.noKeyCon {
					no := false
					c.Auth.Keys = []config.APIKey{{KeySHA256: sha("k-nocont"), Tenant: "t", Continue: &no}}
				}
			}))
			ws[0].srv.AbortStreams(5, 1)
			broken(t, readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", tc.body, tc.hdr...), nil), r)
			if m := ws[1].srv.Metrics(); m.Finished+m.Cancelled != 0 {
				t.Errorf("the stream was continued on w1: %+v", m)
			}
		})
	}
	t.Run("X-Sluice-Continue: on is refused", func(t *testing.T) {
		ws := startSimWorkers(t, contParams(4), 200, "llamacpp")
		r := startRouter(t, contConfig(t, ws, 4, nil))
		resp := postPath(t, context.Background(), r.url, "/v1/chat/completions", body, "X-Sluice-Continue", "on")
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, `"invalid_header"`) || !strings.Contains(b, "X-Sluice-Continue") {
			t.Fatalf("%d %s, want 400 invalid_header naming X-Sluice-Continue", resp.StatusCode, b)
		}
	})
}

// A drain with a deadline moves what still streams from the worker at
// the deadline: the stream reads as uninterrupted, its continuation says
// "drain", and the drained worker is not blamed for it.
func TestContinuation_DrainDeadlineMovesStreams(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 20, "llamacpp", "llamacpp")
	// w0 goes silent after the five tokens the drain is asked at, so the
	// stream cannot end there before the deadline moves it, however the
	// machine schedules the two; the idle timeout is the default, far
	// longer than the test.
	release := make(chan struct{})
	defer close(release)
	ws[0].srv.StallStreams(5, 1, release)
	r := startRouter(t, contConfig(t, ws, 4, nil))
	deadline := make(chan time.Time)
	asked := make(chan time.Duration, 1)
	r.srv.after = func(d time.Duration) <-chan time.Time { asked <- d; return deadline }
	body := `{"model":"m","stream":true,"max_tokens":40,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`
	want, _, _ := sim.Reference("/v1/chat/completions", []byte(body), contParams(4), "")
	drained := make(chan struct{})
	got := readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", body), func(n int) {
		if n != 5 {
			return
		}
		resp := postPath(t, context.Background(), r.url, "/api/workers/w0/drain?deadline=30s", "")
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Errorf("drain: %d %s", resp.StatusCode, b)
		}
		if d := <-asked; d != 30*time.Second {
			t.Errorf("drain deadline %v, want 30s", d)
		}
		deadline <- time.Now()
		close(drained)
	})
	<-drained
	if got.text != want || got.errorEvent != "" || !got.done {
		t.Fatalf("drained stream read %q (error %s, [DONE] %v), want %q", got.text, got.errorEvent, got.done, want)
	}
	c, ok := continuationOf(r)
	if !ok || c.Reason != "drain" || c.From != "w0" || c.Outcome != "ok" {
		t.Fatalf("continuation %+v, want from w0 for drain, ok", c)
	}
	if ws := workerState(t, r.srv, "w0"); !ws.Draining || ws.Health == snapshot.HealthDown {
		t.Fatalf("w0 after its drain: %+v, want draining and not blamed", ws)
	}
	idle(t, r)
	resp := postPath(t, context.Background(), r.url, "/api/workers/w0/drain?deadline=soon", "")
	if b := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, "deadline") {
		t.Fatalf("a bad deadline: %d %s, want 400 naming it", resp.StatusCode, b)
	}
}

// The wait a continuation adds — from the last token before the break to
// the first after it — is about what the new worker's model says the
// prefill of prompt + carried text takes there: the sim's step time of
// that prefill on an idle worker, in real time. It logs p50 and p99 over
// 20 breaks and holds the median within 1.5x of the model.
func TestContinuation_GapIsAboutThePrefill(t *testing.T) {
	const scale, prompt, k = 10, 4000, 10
	p := contParams(4)
	ws := startSimWorkers(t, p, scale, "llamacpp", "llamacpp")
	body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":20,"ignore_eos":true,"sim_prompt_tokens":%d,"messages":[{"role":"user","content":"long"}]}`, prompt)
	eng := sim.NewEngine(p, time.Time{})
	model := time.Duration(float64(eng.StepTime(prompt+k, 0, 1)) / scale)
	var gaps []time.Duration
	for range 20 {
		r := startRouter(t, contConfig(t, ws, 4, nil))
		ws[0].srv.AbortStreams(k, 1)
		got := readStream(t, postPath(t, context.Background(), r.url, "/v1/chat/completions", body), nil)
		if got.contents != 20 || got.errorEvent != "" {
			t.Fatalf("stream: %d tokens, error %s", got.contents, got.errorEvent)
		}
		gaps = append(gaps, got.tokenTimes[k].Sub(got.tokenTimes[k-1]))
		r.stop(t)
	}
	slices.Sort(gaps)
	p50, p99 := gaps[len(gaps)/2], gaps[len(gaps)-1]
	t.Logf("continuation gap p50 %v p99 %v; the model's prefill of %d tokens on the new worker: %v (p50 %.2fx, p99 %.2fx)",
		p50, p99, prompt+k, model, float64(p50)/float64(model), float64(p99)/float64(model))
	if float64(p50) > 1.5*float64(model) {
		t.Errorf("median gap %v is more than 1.5x the prefill the model predicts (%v)", p50, model)
	}
}
