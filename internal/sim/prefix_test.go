package sim

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/prefix/prefixtest"
	"github.com/sluice-router/sluice/internal/telemetry"
)

// runOne submits r alone at now on e, drains e and returns its result.
func runOne(t *testing.T, e *Engine, now time.Time, r Request) Result {
	t.Helper()
	var p probe
	if _, err := e.Submit(now, r, p.callbacks()); err != nil {
		t.Fatal(err)
	}
	drain(e)
	if !p.done {
		t.Fatalf("request %+v did not finish", r)
	}
	return p.res
}

func TestEngine_PrefixCacheSkipsCachedPrefill(t *testing.T) {
	e := NewEngine(testParams(), t0)
	turn1 := Request{PromptTokens: 2000, MaxTokens: 1, IgnoreEOS: true, Prefix: []uint64{1, 2, 3, 4}, PrefixBlockTokens: 500}
	r1 := runOne(t, e, t0, turn1)
	if r1.CachedTokens != 0 {
		t.Fatalf("first request found %d cached tokens in an empty cache", r1.CachedTokens)
	}
	// 2000 tokens at 0.2 ms each.
	if got, want := r1.FirstToken.Sub(r1.Submitted), 400*time.Millisecond; got != want {
		t.Fatalf("TTFT of a cold 2000-token prompt: %v, want %v", got, want)
	}
	// Turn 2 repeats turn 1's four blocks and adds 1000 tokens: only those
	// are prefilled.
	turn2 := Request{PromptTokens: 3000, MaxTokens: 1, IgnoreEOS: true, Prefix: []uint64{1, 2, 3, 4, 5, 6}, PrefixBlockTokens: 500}
	r2 := runOne(t, e, r1.Finished, turn2)
	if got, want := r2.CachedTokens, 2000; got != want {
		t.Fatalf("turn 2 cached tokens: %d, want %d", got, want)
	}
	if got, want := r2.FirstToken.Sub(r2.Submitted), 200*time.Millisecond; got != want {
		t.Fatalf("TTFT of turn 2 (1000 tokens to prefill): %v, want %v", got, want)
	}
	// A fully cached prompt still computes one token.
	r3 := runOne(t, e, r2.Finished, turn2)
	if got, want := r3.CachedTokens, 2999; got != want {
		t.Fatalf("repeat of turn 2: cached %d, want %d (one token always computed)", got, want)
	}
	// A different first block shares nothing, whatever follows.
	r4 := runOne(t, e, r3.Finished, Request{PromptTokens: 3000, MaxTokens: 1, IgnoreEOS: true, Prefix: []uint64{9, 2, 3, 4, 5, 6}, PrefixBlockTokens: 500})
	if r4.CachedTokens != 0 {
		t.Fatalf("a prompt with a different first block found %d cached tokens", r4.CachedTokens)
	}
	if got, want := e.Metrics(r4.Finished).CachedTokens, int64(2000+2999); got != want {
		t.Fatalf("Metrics.CachedTokens = %d, want %d", got, want)
	}
}

func TestEngine_PrefixCacheBoundedByKV(t *testing.T) {
	p := testParams()
	p.KVTokens = 4000 // room for eight 500-token blocks
	e := NewEngine(p, t0)
	a := Request{PromptTokens: 2500, MaxTokens: 1, IgnoreEOS: true, Prefix: []uint64{1, 2, 3, 4, 5}, PrefixBlockTokens: 500}
	b := Request{PromptTokens: 2500, MaxTokens: 1, IgnoreEOS: true, Prefix: []uint64{11, 12, 13, 14, 15}, PrefixBlockTokens: 500}
	now := runOne(t, e, t0, a).Finished
	now = runOne(t, e, now, b).Finished // evicts a's last two blocks; its roots, refreshed last, stay
	if got, want := e.prefix.used, 4000; got != want {
		t.Fatalf("prefix cache holds %d tokens, want its capacity %d", got, want)
	}
	if got, want := runOne(t, e, now, a).CachedTokens, 1500; got != want {
		t.Fatalf("a after b: cached %d, want %d (its first three blocks)", got, want)
	}
}

func TestEngine_NoPrefixNoCache(t *testing.T) {
	e := NewEngine(testParams(), t0)
	r := Request{PromptTokens: 1000, MaxTokens: 1, IgnoreEOS: true}
	runOne(t, e, t0, r)
	if got := runOne(t, e, t0.Add(time.Second), r); got.CachedTokens != 0 || got.FirstToken.Sub(got.Submitted) != 200*time.Millisecond {
		t.Fatalf("a request without hashes used the cache: %+v", got)
	}
	if e.prefix != nil {
		t.Fatalf("a prefix cache was made for requests without hashes")
	}
}

// TestServer_PromptCache sends the same long prompt twice to the HTTP
// server: the second time its blocks are cached, as llama-server's
// cache_prompt would have them, and the timings say so.
func TestServer_PromptCache(t *testing.T) {
	_, hs := newTestServer(t, testParams(), 1000)
	body := fmt.Sprintf(`{"prompt":%q,"n_predict":2,"ignore_eos":true}`, strings.Repeat("the same long document ", 200))
	type timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	}
	var first, second struct {
		Timings timings `json:"timings"`
	}
	decodeBody(t, post(t, hs.URL+"/completion", body), &first)
	decodeBody(t, post(t, hs.URL+"/completion", body), &second)
	if first.Timings.CacheN != 0 {
		t.Fatalf("first request: cache_n %d, want 0", first.Timings.CacheN)
	}
	// 4,600 bytes are 1,150 estimated tokens: 8 whole blocks of 128.
	if got, want := second.Timings.CacheN, 8*128; got != want {
		t.Fatalf("second request: cache_n %d, want %d", got, want)
	}
	if got, want := second.Timings.PromptN, first.Timings.PromptN-8*128; got != want {
		t.Fatalf("second request: prompt_n %d, want %d (the uncached rest)", got, want)
	}

	// A chat completion reports the hit as OpenAI and vLLM do, in usage.
	chat := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":2,"ignore_eos":true}`, strings.Repeat("another long document ", 200))
	var answers [2]struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Timings timings `json:"timings"`
	}
	for i := range answers {
		decodeBody(t, post(t, hs.URL+"/v1/chat/completions", chat), &answers[i])
	}
	if a, b := answers[0], answers[1]; a.Usage.PromptTokensDetails.CachedTokens != 0 || b.Usage.PromptTokensDetails.CachedTokens == 0 ||
		b.Usage.PromptTokensDetails.CachedTokens != b.Timings.CacheN {
		t.Fatalf("chat usage.prompt_tokens_details.cached_tokens %d then %d (cache_n %d), want 0 then cache_n", a.Usage.PromptTokensDetails.CachedTokens, b.Usage.PromptTokensDetails.CachedTokens, b.Timings.CacheN)
	}
}

// TestServer_SlotsReportPrompts: after a chat request, then a raw prompt,
// /slots shows the slot's prompt as llama-server does (BOS text first),
// and the fleet's reading of it (the router's blocks after the BOS) is
// exactly the blocks the router computes for the request.
func TestServer_SlotsReportPrompts(t *testing.T) {
	_, hs := newTestServer(t, testParams(), 1000)
	get := func(path string) io.ReadCloser {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Body
	}
	body := get("/props")
	props, err := telemetry.ParseLlamaCPPProps(body)
	body.Close()
	if err != nil || props.BOSToken == "" {
		t.Fatalf("props %+v, %v", props, err)
	}
	long := strings.Repeat("the same long document ", 60)
	for _, tt := range []struct{ path, body string }{
		{"/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}],"max_tokens":2}`, long)},
		{"/completion", fmt.Sprintf(`{"prompt":%q,"n_predict":2}`, long+"Q:")},
	} {
		post(t, hs.URL+tt.path, tt.body).Body.Close()
		body := get("/slots")
		slots, err := telemetry.ParseLlamaCPPSlots(body)
		body.Close()
		if err != nil {
			t.Fatal(err)
		}
		held := map[uint64]bool{}
		for _, s := range slots.Slots {
			if s.Prompt != "" && !strings.HasPrefix(s.Prompt, props.BOSToken) {
				t.Errorf("slot %d prompt does not start with the BOS text %q: %.40q", s.ID, props.BOSToken, s.Prompt)
			}
			for _, h := range prefix.Text(strings.TrimPrefix(s.Prompt, props.BOSToken), prefix.BlockBytes) {
				held[h] = true
			}
		}
		hashes := prefixtest.FromBody([]byte(tt.body), prefix.BlockBytes)
		if len(hashes) < 2 {
			t.Fatalf("test prompt too short: %d blocks", len(hashes))
		}
		for i, h := range hashes {
			if !held[h] {
				t.Errorf("%s: block %d of the request not in /slots", tt.path, i)
			}
		}
	}
}
