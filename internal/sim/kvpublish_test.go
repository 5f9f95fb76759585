package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/prefix"
	"go.uber.org/goleak"
)

// joinKV subscribes an index to srv's events over loopback ZeroMQ and
// returns once the subscription receives batches: ZeroMQ's slow joiner
// misses what is published before it has joined, so the prefix cache is
// reset (an AllBlocksCleared each time) until one arrives.
func joinKV(t *testing.T, ctx context.Context, srv *Server, base string) (*kvevents.Index, *kvevents.Subscriber, <-chan error) {
	t.Helper()
	ep, rep := srv.KVEvents().Endpoints()
	x := kvevents.NewIndex()
	sub := &kvevents.Subscriber{Worker: "w", Endpoint: ep, Replay: rep, Index: x}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	reset := func() {
		if resp, err := http.Post(base+"/reset_prefix_cache", "application/json", nil); err == nil {
			resp.Body.Close()
		}
	}
	if err := kvevents.Join(ctx, reset, func(ctx context.Context) error { return x.Wait(ctx, "w", kvevents.HasBatch) }); err != nil {
		t.Fatal(err)
	}
	return x, sub, done
}

// A simulated worker with Options.KVEvents publishes its prefix cache over
// loopback ZeroMQ: after a chat request, a subscribed index holds its
// prompt's blocks under the keys cut from the worker's own /tokenize
// answer for the same messages; a reset clears them; Close leaves no
// goroutine behind but the PUB socket's writer, which zmq4 v0.17.0 never
// stops (its socket's Close does not close the writer).
func TestServer_PublishesKVEvents(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
	p := testParams()
	srv, err := NewServer(p, Options{TimeScale: 100, KVEvents: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()
	<-srv.Ready()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x, _, done := joinKV(t, ctx, srv, hs.URL)
	msgs := fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":"hello"}]`, strings.Repeat("a long system prompt. ", 200))
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","max_tokens":2,"messages":`+msgs+`}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := len(prefix.FromFields(json.RawMessage(msgs), nil, prefix.BlockBytes))
	if want < 4 {
		t.Fatalf("the prompt has %d blocks; the test needs several", want)
	}
	tresp, err := http.Post(hs.URL+"/tokenize", "application/json", strings.NewReader(`{"model":"m","messages":`+msgs+`}`))
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(tresp.Body).Decode(&tok); err != nil || tok.Count != len(tok.Tokens) {
		t.Fatalf("/tokenize: %+v %v", tok, err)
	}
	tresp.Body.Close()
	keys := kvevents.BlockKeys(tok.Tokens, prefix.BlockTokens)
	if err := x.Wait(ctx, "w", func(s kvevents.Stats) bool { return s.Blocks >= want }); err != nil {
		t.Fatal(err)
	}
	if n, _, ok, why := x.Match("w", keys); !ok || n != want {
		t.Fatalf("index matches %d of the prompt's %d blocks (ok %v %s)", n, want, ok, why)
	}
	if st, _ := x.Stats("w"); st.BlockSize != prefix.BlockTokens {
		t.Fatalf("block size %d, want %d", st.BlockSize, prefix.BlockTokens)
	}
	if r, err := http.Post(hs.URL+"/reset_prefix_cache", "application/json", nil); err == nil {
		r.Body.Close()
	}
	if err := x.Wait(ctx, "w", func(s kvevents.Stats) bool { return s.Blocks == 0 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
}
