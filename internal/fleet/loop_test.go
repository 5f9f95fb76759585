package fleet

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// A hung worker stalls only its own scraper: while its first probe is
// stuck, another worker's scraper keeps running rounds.
func TestFleet_HungWorkerDoesNotDelayOthers(t *testing.T) {
	r := newRounds()
	f := New(Options{
		Interval:   5 * time.Millisecond,
		Timeout:    time.Minute, // the hung probe stays hung for the test
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		afterRound: r.done,
	})
	t.Cleanup(f.Close)

	hung := llamaServer(t)
	hung.setMode("hang")
	hsrv := serve(t, hung)
	fine := serve(t, llamaServer(t))

	wh, err := f.Add(context.Background(), WorkerConfig{Name: "hung", URL: hsrv.URL, Kind: KindLlamaCPP})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-hung.entered; got != "/health" {
		t.Fatalf("hung on %s, want /health", got)
	}
	if _, err := f.Add(context.Background(), WorkerConfig{Name: "fine", URL: fine.URL, Kind: KindLlamaCPP}); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "fine", 5)
	if got := r.count("hung"); got != 0 {
		t.Fatalf("hung worker finished %d rounds, want 0 (it is hung)", got)
	}
	// Its snapshot is still there without waiting.
	if got := wh.Snapshot().Health; got != snapshot.HealthUnknown {
		t.Errorf("hung worker health = %v, want unknown", got)
	}
	if got := f.Get("fine").Snapshot().Health; got != snapshot.HealthOK {
		t.Errorf("fine worker health = %v, want ok", got)
	}
}

// A hung probe times out on its own deadline and counts as a failure; the
// worker is ejected after FailThreshold of them.
func TestFleet_HungProbeTimesOutAndEjects(t *testing.T) {
	c := newChanges()
	f := New(Options{
		Interval:      time.Millisecond,
		Timeout:       20 * time.Millisecond,
		FailThreshold: 2,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnChange:      c.record,
	})
	t.Cleanup(f.Close)
	hung := llamaServer(t)
	hung.setMode("hang")
	srv := serve(t, hung)
	w, err := f.Add(context.Background(), WorkerConfig{Name: "hung", URL: srv.URL, Kind: KindLlamaCPP})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no health change within 10s")
	}
	s := w.Snapshot()
	if s.Health != snapshot.HealthDown || !strings.Contains(s.HealthReason, "deadline exceeded") {
		t.Fatalf("snapshot = %v %q, want down on a deadline", s.Health, s.HealthReason)
	}
	// Remove returns promptly even though the server still hangs.
	if err := f.Remove("hung"); err != nil {
		t.Fatal(err)
	}
}

// memTransport serves requests in memory with the handler of their host,
// so the scrape loop can run inside a synctest bubble (real sockets would
// stop its fake clock).
type memTransport map[string]http.Handler

func (m memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h, ok := m[req.URL.Host]
	if !ok {
		return nil, &net404{req.URL.Host}
	}
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
		return rec.Result(), nil
	case <-req.Context().Done():
		<-done
		return nil, req.Context().Err()
	}
}

type net404 struct{ host string }

func (e *net404) Error() string { return "dial " + e.host + ": connection refused" }

// The loop's timing, on synctest's fake clock: rounds start Interval after
// the previous round ends, a hung probe takes exactly Timeout, and the
// healthy worker's rounds are unaffected by the hung one.
func TestFleet_LoopTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hung := newFakeServer()
		hung.setMode("hang")
		fine := newFakeServer()
		fine.set("/v1/models", 200, `{"object":"list","data":[{"id":"m"}]}`)
		f := New(Options{
			Client:        &http.Client{Transport: memTransport{"hung": hung, "fine": fine}},
			Interval:      time.Second,
			Timeout:       2 * time.Second,
			FailThreshold: 2,
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		start := time.Now()
		wh, _ := f.Add(t.Context(), WorkerConfig{Name: "hung", URL: "http://hung", Kind: KindOpenAI})
		wf, _ := f.Add(t.Context(), WorkerConfig{Name: "fine", URL: "http://fine", Kind: KindOpenAI})

		// fine: rounds at 0,1,...,10 s. hung: probes at 0, 3, 6, 9 s,
		// each failing 2 s later; down after the second (at 5 s).
		time.Sleep(10*time.Second + time.Second/2)
		synctest.Wait()
		if got, want := fine.hitCount("/v1/models"), 11; got != want {
			t.Errorf("fine worker probed %d times in 10.5s, want %d", got, want)
		}
		if got, want := hung.hitCount("/v1/models"), 4; got != want {
			t.Errorf("hung worker probed %d times in 10.5s, want %d", got, want)
		}
		st := wh.State()
		if st.Health != snapshot.HealthDown || st.ConsecutiveFailures != 3 {
			t.Errorf("hung worker: health %v after %d failures, want down after 3", st.Health, st.ConsecutiveFailures)
		}
		if got, want := st.LastScrape.Sub(start), 9*time.Second; got != want {
			t.Errorf("hung worker's last round started at +%v, want +%v", got, want)
		}
		if got := wf.Snapshot().Health; got != snapshot.HealthOK {
			t.Errorf("fine worker health = %v", got)
		}
		f.Close()
	})
}
