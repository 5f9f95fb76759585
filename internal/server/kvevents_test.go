package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// kvWorker is a simulated worker publishing KV-cache events on loopback.
type kvWorker struct {
	srv *sim.Server
	url string
}

func startKVWorker(t *testing.T, name string) kvWorker {
	t.Helper()
	p := sim.DefaultParams()
	p.Model, p.StartupDelay = "m", 0
	srv, err := sim.NewServer(p, sim.Options{Name: name, TimeScale: 50, KVEvents: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	<-srv.Ready()
	return kvWorker{srv: srv, url: hs.URL}
}

// direct sends a chat request straight to a worker, past the router.
func (w kvWorker) direct(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post(w.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct request: HTTP %d", resp.StatusCode)
	}
}

// Sluice serve in front of two simulated workers publishing their KV-cache
// events over loopback ZeroMQ: one subscriber per worker fills the exact
// index, /api/workers shows it, and a request whose prompt prefix only the
// events can know of — each worker was sent its conversation directly, so
// the router's own guess holds nothing — goes to the worker holding it,
// its record naming the events and their seq. Removing a worker stops its
// subscriber; closing the router leaves no goroutine behind.
func TestServe_KVEventsRouteToTheHolder(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { // after every other cleanup
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, leaks, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
	})
	ws := []kvWorker{startKVWorker(t, "w0"), startKVWorker(t, "w1")}
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval, cfg.Telemetry.Timeout = 20*time.Millisecond, time.Second
	for i, w := range ws {
		ep, rep := w.srv.KVEvents().Endpoints()
		cfg.Workers = append(cfg.Workers, config.Worker{Name: fmt.Sprintf("w%d", i), URL: w.url, Kind: "llamacpp", KVEvents: ep, KVEventsReplay: rep})
	}
	r := startRouter(t, cfg)
	r.srv.kv.timeout = 5 * time.Second // -race on a shared machine
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x := r.srv.kv.index
	// ZeroMQ's slow joiner: reset the workers' caches (an AllBlocksCleared
	// each) until both subscribers have a batch.
	reset := func() {
		for _, w := range ws {
			if resp, err := http.Post(w.url+"/reset_prefix_cache", "application/json", nil); err == nil {
				resp.Body.Close()
			}
		}
	}
	err := kvevents.Join(ctx, reset, func(ctx context.Context) error {
		for i := range ws {
			if err := r.srv.WaitKVEvents(ctx, fmt.Sprintf("w%d", i), kvevents.HasBatch); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.srv.ScrapeNow(ctx) // both healthy before the first pick

	system := func(i int) string {
		return strings.Repeat(fmt.Sprintf("You are assistant number %d and answer briefly. ", i), 60)
	}
	body := func(i int, q string) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system(i), q)
	}
	// Conversation i is sent to worker 1-i directly: w1 holds 0, w0 holds 1.
	for i := range 2 {
		ws[1-i].direct(t, body(i, "first question"))
	}
	for i := range 2 {
		if err := x.Wait(ctx, fmt.Sprintf("w%d", 1-i), func(s kvevents.Stats) bool { return s.Blocks >= 5 }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		resp := post(t, ctx, r.url, body(i, "second question"))
		readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("conversation %d: HTTP %d", i, resp.StatusCode)
		}
		rec := record(t, r, resp)
		holder := fmt.Sprintf("w%d", 1-i)
		if rec.Chosen != holder {
			t.Errorf("conversation %d went to %s, want %s, which holds its prefix", i, rec.Chosen, holder)
		}
		term, ok := prefixTerm(rec, holder)
		st, _ := x.Stats(holder)
		if !ok || !strings.HasPrefix(term.Source, "vLLM KV events, seq ") || term.Raw < 0.5 {
			t.Errorf("conversation %d: %s's prefix term %+v, want the KV events (at seq %d) and most of the prompt", i, holder, term, st.Seq)
		}
	}
	resp, err := http.Get(r.url + "/api/workers")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Workers []struct {
			Name     string  `json:"name"`
			KVEvents *kvView `json:"kv_events"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &list); err != nil {
		t.Fatal(err)
	}
	for _, w := range list.Workers {
		if kv := w.KVEvents; kv == nil || !kv.Synced || kv.Seq < 0 || kv.Blocks < 5 || kv.BlockSize != 128 {
			t.Errorf("/api/workers: %s's kv_events %+v, want in sync with its blocks", w.Name, kv)
		}
	}
	if err := r.srv.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	if r.srv.kv.view("w1") != nil {
		t.Error("w1 removed, its subscriber still runs")
	}
	if _, ok := x.Stats("w1"); ok {
		t.Error("w1 removed, its index is still kept")
	}
}

// The token-block cache is bounded: past its size the least recently
// used prompt goes.
func TestTokenCache_Bounded(t *testing.T) {
	c := newTokenCache(2)
	c.put(1, []uint64{1})
	c.put(2, []uint64{2})
	c.get(1)
	c.put(3, []uint64{3})
	if _, ok := c.get(2); ok || c.len() != 2 {
		t.Fatalf("after 3 puts in a cache of 2: %d held, the least recently used kept %v", c.len(), ok)
	}
	if k, ok := c.get(1); !ok || k[0] != 1 {
		t.Fatal("the recently used entry went")
	}
}

// The token ids of a chat request are asked for with the fields that
// shape its chat template (tools rendered ahead of the messages, the
// template's kwargs), as the request sent them, and a prompt differing
// only in those is another entry of the token cache.
func TestTokenIDs_SendTheChatTemplatesInputs(t *testing.T) {
	bodies := make(chan map[string]json.RawMessage, 4)
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" {
			w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
			return
		}
		var in map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		bodies <- in
		w.Write([]byte(`{"count":3,"max_model_len":4096,"tokens":[1,2,3]}`))
	}))
	defer worker.Close()
	r := startRouter(t, faultConfig(t, []string{worker.URL}, nil))
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{}}}]`)
	in := proxy.TokenizeInput{Messages: msgs, Template: []proxy.Field{{Name: "tools", Value: tools}, {Name: "chat_template_kwargs", Value: json.RawMessage(`{"enable_thinking":false}`)}}}
	out, err := r.srv.postTokenize(context.Background(), "w1", tokenizeBody("m", in))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Tokens) != 3 {
		t.Fatalf("token ids %v, want the worker's three", out.Tokens)
	}
	got := <-bodies
	want := map[string]string{
		"model":                `"m"`,
		"messages":             string(msgs),
		"tools":                string(tools),
		"chat_template_kwargs": `{"enable_thinking":false}`,
	}
	if len(got) != len(want) {
		t.Errorf("/tokenize got fields %v, want %v", keysOf(got), keysOf(want))
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("/tokenize %s = %s, want %s", k, got[k], v)
		}
	}
	plain := proxy.TokenizeInput{Messages: msgs}
	if tokenKey("m", 16, in) == tokenKey("m", 16, plain) {
		t.Error("the same messages with and without tools share a token-cache entry")
	}
	moved := proxy.TokenizeInput{Messages: msgs, Template: []proxy.Field{{Name: "chat_template_kwargs", Value: tools}}}
	if tokenKey("m", 16, moved) == tokenKey("m", 16, proxy.TokenizeInput{Messages: msgs, Template: []proxy.Field{{Name: "tools", Value: tools}}}) {
		t.Error("the same value under two field names shares a token-cache entry")
	}
}

func keysOf[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// A worker whose publisher is not up yet — a vLLM loading its model —
// shows in /api/workers as connecting, with the dial's error, rather
// than as an empty index that says nothing.
func TestKVEvents_ViewShowsConnectingAndWhy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	k := newKVEvents(slog.New(slog.DiscardHandler), 0)
	defer k.close()
	k.start(config.Worker{Name: "w", KVEvents: "tcp://" + addr})
	// The dial fails with no event to wait on: poll, bounded.
	deadline := time.Now().Add(20 * time.Second)
	for k.view("w").LastError == "" {
		if time.Now().After(deadline) {
			t.Fatal("no dial error shown within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	v := k.view("w")
	if v.State != "connecting" || !strings.Contains(v.LastError, "connection refused") || v.LastErrorAt == nil || v.Connects != 0 {
		t.Fatalf("view %+v, want connecting with the dial's error", v)
	}
}

// A worker back to ok from down may be a restarted engine behind a
// connection that never saw the old one go: its subscriber connects
// again, starting the index over, and syncs from the publisher.
func TestKVEvents_WorkerBackFromDownConnectsAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, err := kvevents.NewPublisher(ctx, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ep, rep := pub.Endpoints()
	k := newKVEvents(slog.New(slog.DiscardHandler), 0)
	defer k.close()
	k.start(config.Worker{Name: "w", KVEvents: ep, KVEventsReplay: rep})
	join := func() {
		t.Helper()
		poke := func() { pub.Publish(0, nil) }
		if err := kvevents.Join(ctx, poke, func(ctx context.Context) error { return k.index.Wait(ctx, "w", kvevents.HasBatch) }); err != nil {
			t.Fatal(err)
		}
	}
	join()
	if v := k.view("w"); v.State != "synced" || v.Connects != 1 {
		t.Fatalf("view %+v, want synced after one connection", v)
	}
	k.health("w", snapshot.HealthOK) // ok all along: nothing to do
	k.health("w", snapshot.HealthDown)
	k.health("w", snapshot.HealthOK)
	if err := k.index.Wait(ctx, "w", func(s kvevents.Stats) bool { return s.Seq < 0 }); err != nil {
		t.Fatalf("the index was not started over: %v", err)
	}
	join()
	if v := k.view("w"); v.State != "synced" || v.Connects != 2 {
		t.Fatalf("view %+v, want synced after a second connection", v)
	}
}

// len is how many entries c holds.
func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
