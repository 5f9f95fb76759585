package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// Queued requests keep their bodies: their bytes have a budget, sixteen
// bodies of proxy.max_body_bytes. Past it a request that would wait is
// refused with 429 queue_bytes_full; a smaller one that fits still waits,
// and everything accepted is served.
func TestRouter_QueuedBodiesHaveAByteBudget(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 32)
	const maxBody = 4096
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
		c.Proxy.MaxBodyBytes = maxBody
	}))
	release := sync.OnceFunc(func() { close(w.hold) })
	t.Cleanup(release)              // before the router stops (cleanups run last first): a failing test does not hang
	big := func(id string) string { // just under maxBody
		b := fmt.Sprintf(`{"model":"m","user":%q,"messages":[{"role":"user","content":"%%s"}],"max_tokens":16}`, id)
		return fmt.Sprintf(b, strings.Repeat("x", maxBody-100-len(b)))
	}
	var wg sync.WaitGroup
	statuses := make(chan string, 32)
	send := func(id, body string) {
		wg.Go(func() {
			resp := post(t, context.Background(), r.url, body)
			readAll(t, resp)
			statuses <- fmt.Sprintf("%s %d", id, resp.StatusCode)
		})
	}
	send("held", chat("held", false))
	<-w.arrived
	depth := func() int { return r.srv.Scheduler().QueueDepth("m") }
	for i := range 16 {
		send(fmt.Sprint(i), big(fmt.Sprint(i)))
		waitFor(t, r, func() bool { return depth() == i+1 })
	}
	// The seventeenth big body is over the budget: refused at once.
	over := make(chan *http.Response, 1)
	go func() { over <- post(t, context.Background(), r.url, big("over")) }()
	timeout := time.After(10 * time.Second)
	for resp := (*http.Response)(nil); resp == nil; {
		changed := r.srv.Scheduler().Changed()
		if depth() > 16 {
			t.Fatalf("a request was queued over the byte budget: %d wait, holding more than 16 bodies of %d bytes", depth(), maxBody)
		}
		select {
		case resp = <-over:
			checkError(t, resp, readAll(t, resp), http.StatusTooManyRequests, "queue_bytes_full")
		case <-changed:
		case <-timeout:
			t.Fatal("no answer for the request over the byte budget")
		}
	}
	// A small body still fits.
	send("small", chat("small", false))
	waitFor(t, r, func() bool { return depth() == 17 })
	release()
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if !strings.HasSuffix(s, " 200") {
			t.Errorf("accepted request %s, want 200", s)
		}
	}
}
