package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/decisions"
)

// chatTurns renders a chat request body from role/content pairs.
func chatTurns(t *testing.T, pairs ...string) string {
	t.Helper()
	var msgs []map[string]string
	for i := 0; i+1 < len(pairs); i += 2 {
		msgs = append(msgs, map[string]string{"role": pairs[i], "content": pairs[i+1]})
	}
	b, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 8, "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// record fetches the decision record a response names.
func record(t *testing.T, r *router, resp *http.Response) *decisions.Record {
	t.Helper()
	g, err := http.Get(r.url + "/debug/decisions/" + resp.Header.Get("X-Sluice-Decision"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &decisions.Record{}
	if err := json.Unmarshal([]byte(readAll(t, g)), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func prefixTerm(rec *decisions.Record, worker string) (decisions.Term, bool) {
	for _, c := range rec.Candidates {
		if c.Worker != worker {
			continue
		}
		for _, term := range c.Terms {
			if term.Name == "prefix" {
				return term, true
			}
		}
	}
	return decisions.Term{}, false
}

// TestRouter_ConversationReturnsToItsWorker sends a conversation's second
// turn over HTTP: the proxy hashes the rendered messages, and the worker
// that served the first turn wins the tie it would otherwise lose (to the
// least recently picked worker).
func TestRouter_ConversationReturnsToItsWorker(t *testing.T) {
	ws := []*fakeWorker{newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")}
	r := startRouter(t, testConfig(t, ws, nil))
	sys := strings.Repeat("You answer questions about GPUs briefly and precisely. ", 40)
	q1 := strings.Repeat("Why does a long prompt stall other streams? ", 20)
	resp := post(t, context.Background(), r.url, chatTurns(t, "system", sys, "user", q1))
	readAll(t, resp)
	first := resp.Header.Get("X-Sluice-Worker")

	resp = post(t, context.Background(), r.url, chatTurns(t, "system", sys, "user", q1, "assistant", "hi", "user", "And a short one?"))
	readAll(t, resp)
	if got := resp.Header.Get("X-Sluice-Worker"); got != first {
		t.Fatalf("turn 2 went to %s; want %s, which served turn 1", got, first)
	}
	term, ok := prefixTerm(record(t, r, resp), first)
	if !ok || term.Raw < 0.9 || term.Source != "router index (guess)" || term.Weighted >= 0 {
		t.Fatalf("prefix term of %s in turn 2's record: %+v (found %v); want a match near 1 from the router index, subtracted", first, term, ok)
	}

	// Another conversation shares nothing and goes to the other worker.
	resp = post(t, context.Background(), r.url, chatTurns(t, "user", strings.Repeat("Something else entirely. ", 40)))
	readAll(t, resp)
	if got := resp.Header.Get("X-Sluice-Worker"); got == first {
		t.Fatalf("an unrelated conversation went to %s too; want the least recently picked worker", got)
	}
}
