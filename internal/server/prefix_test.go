package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/sim"
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

// TestRouter_WorkerReportBeatsTheGuess: a simulated llama-server served a
// long prompt that never went through the router (another client, or a
// router restarted since). Its /slots says it holds the prompt; the next
// request extending that prompt goes there, not to the worker the tie
// would give it to, and the record names the worker's report. The other
// worker reports too, holding none of it, and the guess stays the source
// there.
func TestRouter_WorkerReportBeatsTheGuess(t *testing.T) {
	var specs []sim.WorkerSpec
	for _, name := range []string{"gpu0", "gpu1"} {
		p := sim.DefaultParams()
		p.StartupDelay = 0
		specs = append(specs, sim.WorkerSpec{Name: name, Params: p, TimeScale: 100})
	}
	fl, err := sim.StartFleet(context.Background(), specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	cfg := config.DefaultConfig()
	cfg.Stats.Store = filepath.Join(t.TempDir(), "stats.db")
	cfg.Telemetry.Interval = time.Hour // scraped below, when the test says
	cfg.Telemetry.StaleAfter = time.Hour
	var urls []string
	for _, w := range fl.Workers() {
		<-w.Server.Ready()
		urls = append(urls, w.URL)
		cfg.Workers = append(cfg.Workers, config.Worker{Name: w.Name, URL: w.URL, Kind: "llamacpp"})
	}
	r := startRouter(t, cfg)
	model := specs[0].Params.Model

	doc := strings.Repeat("A long shared document about KV caches and prefill. ", 60)
	direct, err := http.Post(urls[1]+"/completion", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"n_predict":2}`, doc)))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, direct)
	for _, name := range []string{"gpu0", "gpu1"} {
		r.srv.fleet.Get(name).ScrapeNow(context.Background())
	}

	resp, err := http.Post(r.url+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":%q}`, model, doc+"Summarise it.")))
	if err != nil {
		t.Fatal(err)
	}
	if text := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, text)
	}
	if got := resp.Header.Get("X-Sluice-Worker"); got != "gpu1" {
		t.Fatalf("the request went to %s; want gpu1, whose /slots holds its prefix", got)
	}
	rec := record(t, r, resp)
	held, ok := prefixTerm(rec, "gpu1")
	if !ok || held.Raw < 0.9 || !strings.HasPrefix(held.Source, "worker report (llama.cpp /slots, ") || held.AgeMs <= 0 {
		t.Errorf("gpu1's prefix term %+v (found %v); want a match near 1 from its /slots report, with the report's age", held, ok)
	}
	other, ok := prefixTerm(rec, "gpu0")
	if !ok || other.Raw != 0 || !strings.HasPrefix(other.Source, "router index (guess); llama.cpp /slots report ") {
		t.Errorf("gpu0's prefix term %+v (found %v); want 0 from the router index, its report holding none", other, ok)
	}
}
