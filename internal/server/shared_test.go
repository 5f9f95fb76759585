package server

import (
	"context"
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
