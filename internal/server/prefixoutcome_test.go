package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// What a worker says it found in its prefix cache reaches the decision
// record beside what the router believed it held, over real HTTP: a whole
// answer's llama.cpp timings.cache_n, and a stream's usage
// (prompt_tokens_details.cached_tokens, asked for with include_usage).
// The second request repeats the first's prompt on the one worker, so the
// worker finds most of it cached and the router expected some.
func TestPrefixOutcome_TheWorkersCountReachesTheRecord(t *testing.T) {
	ws := startSimWorkers(t, contParams(4), 20, "llamacpp")
	r := startRouter(t, contConfig(t, ws, 4, nil))
	prompt := strings.Repeat("the same long system prompt, word after word. ", 80)
	whole := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":%q}]}`, prompt)
	stream := fmt.Sprintf(`{"model":"m","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`, prompt)

	for i, body := range []string{whole, whole, stream} {
		resp := postPath(t, context.Background(), r.url, "/v1/chat/completions", body)
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		idle(t, r) // the lease is ended, its outcome filed
		recs := r.srv.Decisions().Recent(1)
		if len(recs) != 1 {
			t.Fatalf("request %d: %d records", i, len(recs))
		}
		o, ok := recs[0].PrefixOutcome()
		if !ok {
			t.Fatalf("request %d (%s): the record has no prefix outcome", i, recs[0].ID)
		}
		if i == 0 {
			continue // a cold cache: nothing expected, nothing found
		}
		if o.CachedTokens <= 0 || o.ExpectedCachedTokens <= 0 {
			t.Errorf("request %d: prefix outcome %+v, want the worker's cached tokens and the router's belief both above 0", i, o)
		}
	}
}
