package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/redistest"
)

func sharedConfig(t *testing.T, ws []*fakeWorker, redisURL, replica string) config.Config {
	return testConfig(t, ws, func(c *config.Config) {
		c.Stats.Store = redisURL
		c.Shared = config.Shared{Redis: redisURL, Replica: replica, LeaseTTL: 2 * time.Second, Replicas: 2}
	})
}

func TestRouter_TwoReplicasShareTheFleet(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	var ws []*fakeWorker
	for i := range 4 {
		ws = append(ws, newFakeWorker(t, fmt.Sprintf("gpu%d", i)))
	}
	routers := []*router{
		startRouter(t, sharedConfig(t, ws, rs.URL(0), "east")),
		startRouter(t, sharedConfig(t, ws, rs.URL(0), "west")),
	}
	for round := range 10 {
		for _, w := range ws {
			w.hold = make(chan struct{})
			w.arrived = make(chan string, 4)
		}
		var wg sync.WaitGroup
		got := make([]string, 4)
		ids := make([]string, 4)
		start := make(chan struct{})
		for i := range 4 {
			wg.Go(func() {
				<-start
				resp := post(t, context.Background(), routers[i%2].url, chat(fmt.Sprint(i), false))
				got[i], ids[i] = resp.Header.Get("X-Sluice-Worker"), resp.Header.Get("X-Sluice-Decision")
				readAll(t, resp)
			})
		}
		close(start)
		for _, w := range ws { // every worker receives exactly one...
			<-w.arrived
		}
		for _, w := range ws { // ...then all are answered
			close(w.hold)
		}
		wg.Wait()
		slices.Sort(got)
		if want := []string{"gpu0", "gpu1", "gpu2", "gpu3"}; !slices.Equal(got, want) {
			t.Fatalf("round %d: four requests on two replicas served by %v, want one per worker", round, got)
		}
		for i, id := range ids {
			if want := []string{"east-", "west-"}[i%2]; !strings.HasPrefix(id, want) {
				t.Fatalf("decision id %q from replica %s", id, want)
			}
			// The record names the replica that decided and how old the
			// shared state it used was: just answered, well under the
			// lease TTL.
			var rec map[string]any
			if err := json.Unmarshal([]byte(get(t, routers[i%2].url+"/debug/decisions/"+id)), &rec); err != nil {
				t.Fatalf("record %s: %v", id, err)
			}
			age, ok := rec["shared_state_age_ms"].(float64)
			if want := []string{"east", "west"}[i%2]; rec["replica"] != want || !ok || age < 0 || age > 2000 {
				t.Fatalf("record %s: replica %v, shared_state_age_ms %v; want %s and an age within the lease TTL", id, rec["replica"], rec["shared_state_age_ms"], want)
			}
		}
	}
	for _, w := range ws {
		if max, _ := w.stats(); max != 1 {
			t.Errorf("%s had %d requests at once, over its max_concurrency of 1", w.name, max)
		}
	}
	if body := get(t, routers[0].url+"/metrics"); !strings.Contains(body, "sluice_shared_state_degraded 0") {
		t.Errorf("/metrics lacks sluice_shared_state_degraded 0")
	}
}

func TestRouter_ServesWhileRedisIsDown(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ws := []*fakeWorker{newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")}
	r := startRouter(t, sharedConfig(t, ws, rs.URL(0), "solo"))
	rs.Stop()
	for i := range 4 {
		resp := post(t, context.Background(), r.url, chat(fmt.Sprint(i), false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with Redis down: %d %s", i, resp.StatusCode, body)
		}
	}
	if body := get(t, r.url+"/metrics"); !strings.Contains(body, "sluice_shared_state_degraded 1") {
		t.Errorf("/metrics lacks sluice_shared_state_degraded 1 while Redis is down")
	}
	resp, err := http.Get(r.url + "/debug/decisions")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"degraded": true`) || !strings.Contains(body, `"replica": "solo"`) {
		t.Errorf("decision records lack the degraded flag and replica:\n%.2000s", body)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}

// TestRouter_ReplicasShareThePrefixIndex sends a conversation's first turn
// to one replica and its second to another: the second replica learnt from
// the first, through Redis, which worker holds the prefix, and sends the
// turn there rather than to the least recently picked worker.
func TestRouter_ReplicasShareThePrefixIndex(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ws := []*fakeWorker{newFakeWorker(t, "gpu0"), newFakeWorker(t, "gpu1")}
	east := startRouter(t, sharedConfig(t, ws, rs.URL(0), "east"))
	west := startRouter(t, sharedConfig(t, ws, rs.URL(0), "west"))
	sys := strings.Repeat("You answer questions about GPUs briefly and precisely. ", 40)
	q1 := strings.Repeat("Why does a long prompt stall other streams? ", 20)
	resp := post(t, context.Background(), east.url, chatTurns(t, "system", sys, "user", q1))
	readAll(t, resp)
	first := resp.Header.Get("X-Sluice-Worker")

	x := west.srv.prefixShare
	deadline := time.After(20 * time.Second)
	for {
		ch := x.Changed()
		if x.Stats().Applied > 0 {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("west never applied east's record: %+v", x.Stats())
		}
	}
	resp = post(t, context.Background(), west.url, chatTurns(t, "system", sys, "user", q1, "assistant", "hi", "user", "And a short one?"))
	readAll(t, resp)
	if got := resp.Header.Get("X-Sluice-Worker"); got != first {
		t.Fatalf("turn 2 on the other replica went to %s; want %s, which served turn 1", got, first)
	}
	term, ok := prefixTerm(record(t, west, resp), first)
	if !ok || term.Raw < 0.9 || term.Source != "router index (shared)" {
		t.Fatalf("prefix term of %s in turn 2's record: %+v (found %v); want a match near 1 learnt from the other replica", first, term, ok)
	}
	body := get(t, west.url+"/metrics")
	for _, want := range []string{"sluice_prefix_share_applied_total 1", "sluice_prefix_share_up 1", `sluice_prefix_share_dropped_total{reason="queue_full"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestRouter_PrefixIndexSharedOnlyWithRedis(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ws := []*fakeWorker{newFakeWorker(t, "gpu0")}
	for _, c := range []struct {
		name   string
		edit   func(*config.Config)
		shared bool
	}{
		{"bbolt stats, alone", func(*config.Config) {}, false},
		{"redis stats", func(c *config.Config) { c.Stats.Store = rs.URL(0) }, true},
		{"shared ledger", func(c *config.Config) { c.Shared.Redis = rs.URL(0) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRouter(t, testConfig(t, ws, c.edit))
			if got := r.srv.prefixShare != nil; got != c.shared {
				t.Fatalf("prefix index shared = %v, want %v", got, c.shared)
			}
			if has := strings.Contains(get(t, r.url+"/metrics"), "sluice_prefix_share_published_total"); has != c.shared {
				t.Errorf("/metrics has the sharing's counters = %v, want %v", has, c.shared)
			}
		})
	}
}
