package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// requestIndex reads the index the runner puts at the start of each prompt.
func requestIndex(t *testing.T, r *http.Request) (int, chatRequest) {
	t.Helper()
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		t.Errorf("decode request: %v", err)
		return -1, req
	}
	var i int
	if _, err := fmt.Sscanf(req.Messages[0].Content, "Request %d.", &i); err != nil {
		t.Errorf("prompt %q: %v", truncate(req.Messages[0].Content, 40), err)
		return -1, req
	}
	return i, req
}

// writeStream writes an OpenAI chat stream with n content chunks and a
// usage chunk reporting usage tokens (none if usage < 0).
func writeStream(w http.ResponseWriter, n, usage int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Sluice-Worker", "w1")
	w.Header().Set("X-Sluice-Queue-Ms", "12.5")
	fl := w.(http.Flusher)
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		fl.Flush()
	}
	if usage >= 0 {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d}}\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// jumpClock is a fake clock whose sleeps return at once, moving time to
// the wake-up instant: the schedule runs in virtual time.
type jumpClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *jumpClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	return ctx.Err()
}

// blockingServer holds request 0 until the others have all arrived; a
// closed-loop runner would deadlock against it.
func blockingServer(t *testing.T, others int) (*httptest.Server, <-chan struct{}) {
	release := make(chan struct{})
	allIn := make(chan struct{})
	var mu sync.Mutex
	seen := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, req := requestIndex(t, r)
		if !req.IgnoreEOS || !req.Stream || req.StreamOptions == nil || !req.StreamOptions.IncludeUsage {
			t.Errorf("request %d: %+v", i, req)
		}
		if i == 0 {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		} else {
			mu.Lock()
			seen++
			if seen == others {
				close(allIn)
			}
			mu.Unlock()
		}
		writeStream(w, req.MaxTokens, req.MaxTokens)
	}))
	t.Cleanup(srv.Close)
	go func() {
		select {
		case <-allIn:
		case <-time.After(10 * time.Second): // a failure bound, not synchronisation
			t.Error("later arrivals were not sent while request 0 was in flight")
		}
		close(release)
	}()
	return srv, release
}

func TestRun_OpenLoopWallClock(t *testing.T) {
	srv, _ := blockingServer(t, 2)
	items := []Item{{At: 0, PromptTokens: 10, OutputTokens: 4}, {At: 20 * time.Millisecond, PromptTokens: 20, OutputTokens: 3},
		{At: 40 * time.Millisecond, PromptTokens: 30, OutputTokens: 5}}
	results, err := Run(context.Background(), RunConfig{Target: srv.URL, Items: items, Stream: true, Timeout: 20 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if !r.OK() {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	end0 := results[0].Start + results[0].E2E
	for _, r := range results[1:] {
		if r.Start >= end0 {
			t.Errorf("request %d sent at %v, not while request 0 was in flight (until %v)", r.Index, r.Start, end0)
		}
		if r.Lateness > time.Second || r.Lateness < 0 {
			t.Errorf("request %d sent %v late", r.Index, r.Lateness)
		}
	}
}

func TestRun_OpenLoopVirtualClock(t *testing.T) {
	srv, _ := blockingServer(t, 3)
	clock := &jumpClock{now: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
	items := []Item{{At: 0, OutputTokens: 2, Row: 2}, {At: time.Hour, OutputTokens: 2, Row: 3},
		{At: 2 * time.Hour, OutputTokens: 2, Row: 4}, {At: 2 * time.Hour, OutputTokens: 2, Row: 5}}
	var last Progress
	results, err := Run(context.Background(), RunConfig{Target: srv.URL, Items: items, Stream: true, Clock: clock}, func(p Progress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if !r.OK() || r.Start != items[i].At || r.Lateness != 0 || r.Row != items[i].Row || r.Scheduled != items[i].At {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if last.Done != 4 || last.Total != 4 || last.Sent != 4 || last.InFlight != 0 {
		t.Fatalf("final progress %+v", last)
	}
}

func TestRun_Measures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
			t.Errorf("%s %s", r.Method, r.URL.Path)
		}
		i, req := requestIndex(t, r)
		switch i {
		case 0:
			if got := len(req.Messages[0].Content); got < 395 || got > 400 {
				t.Errorf("prompt of 100 tokens has %d chars, want about 400", got)
			}
			if req.Model != "m" {
				t.Errorf("model %q", req.Model)
			}
			writeStream(w, 5, 7) // usage wins over the chunk count
		case 1:
			writeStream(w, 4, -1) // no usage: count chunks
		case 2:
			w.Header().Set("X-Sluice-Reason", "queue_full")
			w.Header().Set("Retry-After", "2")
			w.Header().Set("X-Sluice-Worker", "")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"queue is full","type":"rate_limit"}}`)
		case 3:
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "boom")
		case 4:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"error\":{\"message\":\"out of memory\"}}\n\n")
		}
	}))
	defer srv.Close()
	items := []Item{{PromptTokens: 100, OutputTokens: 5}, {OutputTokens: 4}, {OutputTokens: 1}, {OutputTokens: 1}, {OutputTokens: 3}}
	results, err := Run(context.Background(), RunConfig{Target: srv.URL + "/", Items: items, Model: "m", Stream: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := results[0]
	if !r.OK() || r.OutputTokens != 7 || r.Worker != "w1" || r.QueueMs != 12.5 || r.Status != 200 || r.TTFT <= 0 || r.E2E < r.TTFT {
		t.Errorf("0: %+v", r)
	}
	if want := (r.E2E - r.TTFT) / 6; r.TPOT != want || r.DecodeRate <= 0 {
		t.Errorf("0: TPOT %v, want %v; rate %v", r.TPOT, want, r.DecodeRate)
	}
	if r := results[1]; !r.OK() || r.OutputTokens != 4 {
		t.Errorf("1: %+v", r)
	}
	if r := results[2]; r.Kind != KindRefused || r.Status != 429 || r.Reason != "queue_full" || r.RetryAfter != "2" || !strings.Contains(r.Err, "queue is full") {
		t.Errorf("2: %+v", r)
	}
	if r := results[3]; r.Kind != KindHTTP || r.Status != 500 || !strings.Contains(r.Err, "boom") || r.QueueMs != -1 {
		t.Errorf("3: %+v", r)
	}
	if r := results[4]; r.Kind != KindStream || !strings.Contains(r.Err, "out of memory") {
		t.Errorf("4: %+v", r)
	}
}

func TestRun_NonStreaming(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, req := requestIndex(t, r)
		if req.Stream || req.StreamOptions != nil {
			t.Errorf("streaming request: %+v", req)
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":9}}`)
	}))
	defer srv.Close()
	results, err := Run(context.Background(), RunConfig{Target: srv.URL, Items: []Item{{OutputTokens: 9}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := results[0]; !r.OK() || r.OutputTokens != 9 || r.TTFT != r.E2E {
		t.Fatalf("%+v", r)
	}
}

func TestRun_CapRecordsInsteadOfDelaying(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		writeStream(w, 2, 2)
	}))
	defer srv.Close()
	clock := &jumpClock{now: time.Unix(0, 0)}
	var once sync.Once
	progress := func(p Progress) {
		// The capped arrival counts as done while request 0 is held.
		if p.Done >= 1 {
			once.Do(func() { close(release) })
		}
	}
	items := []Item{{At: 0, OutputTokens: 2}, {At: time.Second, OutputTokens: 2}}
	results, err := Run(context.Background(), RunConfig{Target: srv.URL, Items: items, Stream: true, Clock: clock, MaxInFlight: 1}, progress)
	if err != nil {
		t.Fatal(err)
	}
	if !results[0].OK() || results[1].Kind != KindCapped {
		t.Fatalf("results %+v", results)
	}
}

func TestRun_CancelMarksUnsent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	results, err := Run(ctx, RunConfig{Target: "http://127.0.0.1:1", Items: []Item{{At: time.Hour}, {At: 2 * time.Hour}}}, nil)
	if err == nil {
		t.Fatal("no error from a cancelled run")
	}
	for _, r := range results {
		if r.Kind != KindCanceled {
			t.Fatalf("%+v", r)
		}
	}
	if _, err := Run(context.Background(), RunConfig{Target: "localhost:8080"}, nil); err == nil {
		t.Fatal("bad target accepted")
	}
}

func TestReadSSE(t *testing.T) {
	stream := ": keep-alive comment\n" +
		"event: message\n" +
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data:{\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n" +
		"data: {\"choices\":[{\"delta\":\n" + // one event over two data lines
		"data: {\"reasoning_content\":\"hm\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":3}}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n" +
		"data: {\"choices\":[],\"timings\":{\"cache_n\":64}}\n\n" +
		"data: [DONE]\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"after done\"}}]}\n\n"
	var got []chunk
	if err := readSSE(strings.NewReader(stream), func(c chunk) error { got = append(got, c); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []chunk{{Usage: -1, Cached: -1}, {Content: true, Usage: -1, Cached: -1}, {Content: true, Usage: -1, Cached: -1}, {Usage: 3, Cached: -1},
		{Usage: 3, Cached: 96}, {Usage: -1, Cached: 64}, {Done: true, Usage: -1, Cached: -1}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if err := readSSE(strings.NewReader("data: {not json\n\n"), func(chunk) error { return nil }); err == nil {
		t.Error("malformed chunk accepted")
	}
	// A stream cut off without a final blank line still delivers its event.
	n := 0
	if err := readSSE(strings.NewReader(`data: {"choices":[{"delta":{"content":"x"}}]}`), func(c chunk) error { n++; return nil }); err != nil || n != 1 {
		t.Errorf("unterminated event: n=%d err=%v", n, err)
	}
}

func FuzzReadSSE(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"usage\":{\"completion_tokens\":3},\"error\":\"x\"}\n\n")
	f.Add(": c\ndata: a\ndata: b\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		_ = readSSE(strings.NewReader(s), func(c chunk) error {
			if c.Done && (c.Content || c.Usage != -1) {
				t.Fatalf("done chunk with content: %+v", c)
			}
			return nil
		})
	})
}

// TestRun_PrefixHashesBecomeSharedText sends three items over HTTP: two
// that share their first two block hashes (of 128 tokens, 512 characters
// here) and differ in the third, and one without hashes. The first two
// prompts must start with the same 1,024 characters and differ after
// them, each item's prompt must be about its size, only the item without
// hashes starts with its index, and each result carries the cached
// prompt tokens its answer reported.
func TestRun_PrefixHashesBecomeSharedText(t *testing.T) {
	var mu sync.Mutex
	got := map[int]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req chatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("decode request: %v", err)
			return
		}
		content := req.Messages[0].Content
		var i int
		if k := strings.Index(content, "Request "); k < 0 {
			t.Errorf("prompt without its index: %q", truncate(content, 40))
		} else if _, err := fmt.Sscanf(content[k:], "Request %d.", &i); err != nil {
			t.Errorf("prompt %q: %v", truncate(content[k:], 40), err)
		}
		mu.Lock()
		got[i] = content
		mu.Unlock()
		// The worker's report of the cached prompt tokens, as vLLM and
		// OpenAI put it in the usage chunk.
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"}}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", 10*i)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	items := []Item{
		{PromptTokens: 400, OutputTokens: 1, Prefix: []uint64{11, 22, 33}, PrefixBlockTokens: 128},
		{PromptTokens: 450, OutputTokens: 1, Prefix: []uint64{11, 22, 44}, PrefixBlockTokens: 128},
		{PromptTokens: 300, OutputTokens: 1},
	}
	results, err := Run(context.Background(), RunConfig{Target: srv.URL, Items: items, Stream: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if !r.OK() || r.CachedTokens != 10*i {
			t.Errorf("item %d: %+v, want OK with the %d cached tokens its answer reported", i, r, 10*i)
		}
	}
	a, b, c := got[0], got[1], got[2]
	for i, p := range []string{a, b, c} {
		if want := items[i].PromptTokens * charsPerToken; len(p) < want-4 || len(p) > want+16 {
			t.Errorf("item %d: prompt of %d chars, want about %d", i, len(p), want)
		}
	}
	shared := 2 * 128 * charsPerToken
	if len(a) < shared || len(b) < shared || a[:shared] != b[:shared] {
		t.Fatalf("items 0 and 1 do not share their first %d characters", shared)
	}
	if a[shared:shared+64] == b[shared:shared+64] {
		t.Errorf("items 0 and 1 share their third block, whose hashes differ: %q", a[shared:shared+64])
	}
	if strings.HasPrefix(a, "Request ") || !strings.HasPrefix(c, "Request 2.") {
		t.Errorf("prompt starts: %q and %q; want shared text first for hashed items, the index for the other", truncate(a, 20), truncate(c, 20))
	}
}
