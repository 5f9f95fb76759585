package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind classifies how a request ended.
type Kind string

// The kinds of request outcome.
const (
	// KindOK is a 2xx response read to the end.
	KindOK Kind = ""
	// KindRefused is a 429 or 503: the router or worker declined the
	// request (admission control), with X-Sluice-Reason and Retry-After.
	KindRefused Kind = "refused"
	// KindHTTP is any other non-2xx status.
	KindHTTP Kind = "http"
	// KindTimeout is a request that exceeded RunConfig.Timeout.
	KindTimeout Kind = "timeout"
	// KindTransport is a connection or protocol failure.
	KindTransport Kind = "transport"
	// KindStream is an error event or malformed data inside a 2xx stream.
	KindStream Kind = "stream"
	// KindCapped is a request not sent because MaxInFlight requests were
	// already outstanding. The cap protects the machine running the bench;
	// hitting it means the target is far past saturation.
	KindCapped Kind = "capped"
	// KindCanceled is a request cut short or never sent because the run's
	// context ended.
	KindCanceled Kind = "canceled"
)

// Result is the measurement of one request.
type Result struct {
	// Index is the position of the item in RunConfig.Items; Row its
	// source row.
	Index int `json:"index"`
	Row   int `json:"row"`
	// Scheduled is the arrival offset the item asked for; Start the
	// offset at which it was actually sent; Lateness their difference.
	Scheduled time.Duration `json:"scheduled_ns"`
	Start     time.Duration `json:"start_ns"`
	Lateness  time.Duration `json:"lateness_ns"`
	// PromptTokens and MaxTokens are what was asked for.
	PromptTokens int `json:"prompt_tokens"`
	MaxTokens    int `json:"max_tokens"`
	// TTFT is the time from send to the first content chunk (to the whole
	// response when not streaming); E2E to the end of the response.
	TTFT time.Duration `json:"ttft_ns"`
	E2E  time.Duration `json:"e2e_ns"`
	// OutputTokens is from the usage object when present, else the number
	// of content chunks.
	OutputTokens int `json:"output_tokens"`
	// TPOT is (E2E−TTFT)/(OutputTokens−1) and DecodeRate its inverse in
	// tokens per second; both zero with fewer than two tokens.
	TPOT       time.Duration `json:"tpot_ns"`
	DecodeRate float64       `json:"decode_tokens_per_s"`
	// Status is the HTTP status (0 if none was received).
	Status int `json:"status"`
	// Kind and Err say how the request failed, if it did.
	Kind Kind   `json:"kind"`
	Err  string `json:"error,omitempty"`
	// Reason and RetryAfter are the X-Sluice-Reason and Retry-After
	// headers of a refusal.
	Reason     string `json:"reason,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	// Worker is the X-Sluice-Worker response header: who served it.
	Worker string `json:"worker,omitempty"`
	// QueueMs is the X-Sluice-Queue-Ms header, or -1 when absent.
	QueueMs float64 `json:"queue_ms"`
	// CachedTokens is how many prompt tokens the worker found in its
	// prefix cache and did not prefill, where it is known: the
	// virtual-time simulation's count, or what the answer said
	// (usage.prompt_tokens_details.cached_tokens, llama.cpp's
	// timings.cache_n); 0 otherwise.
	CachedTokens int `json:"cached_tokens,omitempty"`
}

// OK reports whether the request succeeded.
func (r Result) OK() bool { return r.Kind == KindOK }

// KindLabel is the kind with the status where it matters, e.g.
// "refused 429" or "http 500"; "ok" for successes.
func (r Result) KindLabel() string {
	switch r.Kind {
	case KindOK:
		return "ok"
	case KindRefused, KindHTTP:
		return fmt.Sprintf("%s %d", r.Kind, r.Status)
	}
	return string(r.Kind)
}

// Clock is the time source of a run. Tests inject one to drive the
// schedule without sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// SleepUntil blocks until t or until ctx ends (returning its error).
	SleepUntil(ctx context.Context, t time.Time) error
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// SleepUntil waits on a timer until t.
func (RealClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RunConfig describes one open-loop run.
type RunConfig struct {
	// Target is the base URL; requests go to Target/v1/chat/completions.
	Target string
	// Items is the load. They are sent in order of At.
	Items []Item
	// Model is the "model" field of each request.
	Model string
	// Stream requests server-sent events; without it TTFT equals E2E.
	Stream bool
	// Timeout bounds each request (0 = none).
	Timeout time.Duration
	// MaxInFlight caps outstanding requests; arrivals over the cap are
	// recorded as KindCapped rather than delayed, so the schedule of the
	// rest is kept. Zero means 10000.
	MaxInFlight int
	// SLO is carried for the summary; Run itself does not use it.
	SLO SLO
	// Client sends the requests; nil means a client whose transport keeps
	// enough idle connections for MaxInFlight.
	Client *http.Client
	// Clock is the time source; nil means RealClock.
	Clock Clock
}

// Progress is a snapshot of a running benchmark.
type Progress struct {
	// Total items, how many were Sent, how many are Done and how many of
	// those failed.
	Total, Sent, Done, Failed int
	// InFlight is the number of requests sent and not yet finished.
	InFlight int
	// Elapsed is the time since the run started; Span the schedule length.
	Elapsed, Span time.Duration
}

// Run sends every item at its arrival time whether or not earlier requests
// have finished (open loop) and measures each. The schedule is fixed up
// front; one goroutine dispatches and each request runs in a goroutine of
// its own, so a slow response never delays a later arrival. progress, if
// not nil, is called from a single goroutine about five times a second and
// once at the end.
//
// Results are in the order of cfg.Items. If ctx ends, outstanding requests
// are cancelled, unsent ones are recorded as KindCanceled, and the results
// are returned with ctx's error.
func Run(ctx context.Context, cfg RunConfig, progress func(Progress)) ([]Result, error) {
	u, err := url.Parse(cfg.Target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("bench: target %q: want http(s)://host[:port]", cfg.Target)
	}
	endpoint := strings.TrimRight(cfg.Target, "/") + "/v1/chat/completions"
	capN := cfg.MaxInFlight
	if capN <= 0 {
		capN = 10000
	}
	clock := cfg.Clock
	if clock == nil {
		clock = RealClock{}
	}
	client := cfg.Client
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = capN
		tr.MaxIdleConnsPerHost = capN
		client = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	order := make([]int, len(cfg.Items))
	maxPrompt := 0
	for i, it := range cfg.Items {
		order[i] = i
		maxPrompt = max(maxPrompt, it.PromptTokens)
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(cfg.Items[a].At, cfg.Items[b].At)
	})
	var span time.Duration
	if len(order) > 0 {
		span = cfg.Items[order[len(order)-1]].At
	}
	r := &runner{cfg: cfg, endpoint: endpoint, client: client, clock: clock, text: fillerText(maxPrompt * charsPerToken)}

	results := make([]Result, len(cfg.Items))
	var sent, done, failed, inflight atomic.Int64
	start := clock.Now()
	snapshot := func() Progress {
		return Progress{Total: len(cfg.Items), Sent: int(sent.Load()), Done: int(done.Load()), Failed: int(failed.Load()),
			InFlight: int(inflight.Load()),
			Elapsed:  clock.Now().Sub(start), Span: span}
	}
	stopProgress := func() {}
	if progress != nil {
		stop, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					progress(snapshot())
				case <-stop:
					return
				}
			}
		}()
		stopProgress = func() { close(stop); <-exited }
	}

	sem := make(chan struct{}, capN)
	var wg sync.WaitGroup
	var runErr error
	for k, i := range order {
		it := cfg.Items[i]
		if err := clock.SleepUntil(ctx, start.Add(it.At)); err != nil {
			runErr = err
			for _, j := range order[k:] {
				results[j] = unsent(j, cfg.Items[j], KindCanceled, "run cancelled before send: "+err.Error())
			}
			break
		}
		select {
		case sem <- struct{}{}:
		default:
			results[i] = unsent(i, it, KindCapped, fmt.Sprintf("not sent: %d requests in flight", capN))
			results[i].Start = clock.Now().Sub(start)
			results[i].Lateness = results[i].Start - it.At
			done.Add(1)
			failed.Add(1)
			continue
		}
		sent.Add(1)
		inflight.Add(1)
		wg.Add(1)
		// The send time is taken here rather than in the goroutine, so
		// that it is the dispatcher's view of the schedule (and so that a
		// virtual clock cannot move on before the goroutine runs).
		sendAt := clock.Now()
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res := r.do(ctx, i, it, start, sendAt)
			results[i] = res
			inflight.Add(-1)
			if !res.OK() {
				failed.Add(1)
			}
			done.Add(1)
		}()
	}
	wg.Wait()
	stopProgress()
	if progress != nil {
		progress(snapshot())
	}
	if runErr == nil {
		runErr = ctx.Err()
	}
	if runErr != nil {
		return results, fmt.Errorf("bench run: %w", runErr)
	}
	return results, nil
}

func unsent(i int, it Item, k Kind, msg string) Result {
	return Result{Index: i, Row: it.Row, Scheduled: it.At, PromptTokens: it.PromptTokens, MaxTokens: maxTokensFor(it), Kind: k, Err: msg, QueueMs: -1}
}

func maxTokensFor(it Item) int { return max(1, it.OutputTokens) }

type runner struct {
	cfg      RunConfig
	endpoint string
	client   *http.Client
	clock    Clock
	text     string
}

// charsPerToken is the rough English ratio used to size synthetic prompts.
const charsPerToken = 4

// fillerWords make a prompt that tokenises like prose rather than one
// repeated token.
var fillerWords = strings.Fields(`the router measures every worker before it sends a request and
keeps the queue short when memory on the card runs low so that tail latency stays close to the median
while throughput remains high across long prompts short answers bursts of traffic and quiet hours`)

// fillerText returns n characters of varied prose.
func fillerText(n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	for i := 0; b.Len() < n; i++ {
		// Step through the words with a stride coprime to their count so
		// that the text does not repeat with a short period.
		b.WriteString(fillerWords[(i*7+i/len(fillerWords))%len(fillerWords)])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// prompt returns about it.PromptTokens tokens of text for request i.
// Without prefix hashes it starts with the request index, so that no two
// requests share a cached prefix. With them (a Mooncake row's hash_ids, a
// synthetic conversation's blocks) each hashed block is text that only its
// hash yields, so requests that share a block hash share its text and the
// router and the workers, which hash the text they are sent, see the
// prefix the load meant; the rest, from the request index on, is its own.
func (r *runner) prompt(i int, it Item) string {
	var b strings.Builder
	if it.PrefixBlockTokens > 0 {
		left := it.PromptTokens * charsPerToken
		b.Grow(left)
		for _, h := range it.Prefix {
			n := min(it.PrefixBlockTokens*charsPerToken, left)
			if n <= 0 {
				break
			}
			writeBlockText(&b, h, n)
			left -= n
		}
	}
	head := fmt.Sprintf("Request %d. ", i)
	b.WriteString(head)
	n := max(it.PromptTokens*charsPerToken-b.Len(), 0)
	b.WriteString(r.text[:min(n, len(r.text))])
	return b.String()
}

// writeBlockText writes n characters of prose drawn from the filler words
// by a generator seeded with h: equal hashes give equal text, different
// ones text that differs within a few words.
func writeBlockText(b *strings.Builder, h uint64, n int) {
	rng := rand.New(rand.NewPCG(h, h^0x9e3779b97f4a7c15))
	end := b.Len() + n
	for b.Len() < end {
		w := fillerWords[rng.IntN(len(fillerWords))]
		if room := end - b.Len(); room <= len(w) {
			b.WriteString(w[:room])
			break
		}
		b.WriteString(w)
		b.WriteByte(' ')
	}
}

type chatRequest struct {
	Model         string        `json:"model,omitempty"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	Stream        bool          `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (r *runner) body(i int, it Item) ([]byte, error) {
	req := chatRequest{
		Model:     r.cfg.Model,
		Messages:  []chatMessage{{Role: "user", Content: r.prompt(i, it)}},
		MaxTokens: maxTokensFor(it),
		IgnoreEOS: true,
		Stream:    r.cfg.Stream,
	}
	if r.cfg.Stream {
		req.StreamOptions = &struct {
			IncludeUsage bool `json:"include_usage"`
		}{true}
	}
	return json.Marshal(req)
}

// do sends one request and measures it.
func (r *runner) do(ctx context.Context, i int, it Item, start, sendAt time.Time) Result {
	res := Result{Index: i, Row: it.Row, Scheduled: it.At, PromptTokens: it.PromptTokens, MaxTokens: maxTokensFor(it), QueueMs: -1}
	body, err := r.body(i, it)
	if err != nil {
		res.Kind, res.Err = KindTransport, fmt.Sprintf("encode request: %v", err)
		return res
	}
	rctx := ctx
	if r.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, r.cfg.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, r.endpoint, bytes.NewReader(body))
	if err != nil {
		res.Kind, res.Err = KindTransport, fmt.Sprintf("build request: %v", err)
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	if r.cfg.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}

	res.Start = sendAt.Sub(start)
	res.Lateness = res.Start - it.At
	fail := func(err error) Result {
		res.E2E = r.clock.Now().Sub(sendAt)
		switch {
		case ctx.Err() != nil:
			res.Kind = KindCanceled
		case rctx.Err() != nil || isTimeout(err):
			res.Kind = KindTimeout
		case res.Kind == "":
			res.Kind = KindTransport
		}
		res.Err = err.Error()
		return res
	}

	resp, err := r.client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Worker = resp.Header.Get("X-Sluice-Worker")
	if q := resp.Header.Get("X-Sluice-Queue-Ms"); q != "" {
		if v, err := strconv.ParseFloat(q, 64); err == nil && v >= 0 {
			res.QueueMs = v
		}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		res.Kind = KindHTTP
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			res.Kind = KindRefused
			res.Reason = resp.Header.Get("X-Sluice-Reason")
			res.RetryAfter = resp.Header.Get("Retry-After")
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		res.E2E = r.clock.Now().Sub(sendAt)
		res.TTFT = res.E2E
		msg := errorMessage(jsonField(b, "error"))
		if msg == "" {
			msg = truncate(strings.TrimSpace(string(b)), 200)
		}
		res.Err = fmt.Sprintf("%s: %s", resp.Status, msg)
		return res
	}

	chunks, usage := 0, -1
	if r.cfg.Stream {
		var streamErr string
		err = readSSE(resp.Body, func(c chunk) error {
			if c.Content {
				if chunks == 0 {
					res.TTFT = r.clock.Now().Sub(sendAt)
				}
				chunks++
			}
			if c.Usage >= 0 {
				usage = c.Usage
			}
			if c.Cached >= 0 {
				res.CachedTokens = c.Cached
			}
			if c.Err != "" {
				streamErr = c.Err
			}
			return nil
		})
		if err == nil && streamErr != "" {
			res.Kind = KindStream
			err = errors.New(streamErr)
		}
		if err == nil && chunks == 0 && usage < 0 {
			res.Kind = KindStream
			err = errStreamEnded
		}
	} else {
		var c completion
		if err = json.NewDecoder(resp.Body).Decode(&c); err != nil {
			res.Kind = KindStream
			err = fmt.Errorf("decode response: %w", err)
		} else if m := errorMessage(c.Error); m != "" {
			res.Kind = KindStream
			err = errors.New(m)
		} else {
			if c.Usage != nil {
				usage = c.Usage.CompletionTokens
			}
			res.CachedTokens = max(c.cached(), 0)
		}
	}
	if err != nil {
		if ctx.Err() == nil && rctx.Err() == nil && res.Kind == "" {
			res.Kind = KindStream
		}
		return fail(err)
	}
	res.E2E = r.clock.Now().Sub(sendAt)
	if chunks == 0 {
		res.TTFT = res.E2E
	}
	res.OutputTokens = chunks
	if usage >= 0 {
		res.OutputTokens = usage
	}
	if res.OutputTokens >= 2 && res.E2E > res.TTFT {
		decode := res.E2E - res.TTFT
		res.TPOT = decode / time.Duration(res.OutputTokens-1)
		res.DecodeRate = float64(res.OutputTokens-1) / decode.Seconds()
	}
	return res
}

func jsonField(b []byte, name string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m[name]
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
