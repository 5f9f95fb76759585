package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
)

// histogram returns the sample count and sum of one series of a histogram
// in the router's own registry; count 0 when the series does not exist.
func histogram(t *testing.T, r *router, name string, labels map[string]string) (count uint64, sum float64) {
	t.Helper()
	fams, err := r.srv.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && l.GetValue() != want {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}

// TestRouter_TTFTRunsFromArrivalWorkerTTFTFromSending queues a streamed
// request behind a held one on a worker that takes one at a time: its
// sluice_ttft_seconds must span its wait in the queue on top of the
// worker's share, sluice_worker_ttft_seconds must hold only the time after
// the worker was free, and its decision record must say both.
func TestRouter_TTFTRunsFromArrivalWorkerTTFTFromSending(t *testing.T) {
	w := newFakeWorker(t, "gpu0")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 4)
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, nil)) // max_concurrency 1

	// The held request is not streamed, so the TTFT histograms hold the
	// queued request's times alone.
	heldDone := make(chan struct{})
	go func() {
		defer close(heldDone)
		readAll(t, post(t, context.Background(), r.url, chat("held", false)))
	}()
	<-w.arrived

	type answer struct {
		resp *http.Response
		end  time.Time // when its whole stream had been read
	}
	queued := make(chan answer, 1)
	go func() {
		resp := post(t, context.Background(), r.url, chat("queued", true))
		readAll(t, resp)
		queued <- answer{resp, time.Now()}
	}()
	waitFor(t, r, func() bool { return r.srv.Scheduler().QueueDepth("m") == 1 })
	// The queued request is sent to the worker only after this moment:
	// the worker's slot frees when the held answer has been relayed.
	release := time.Now()
	close(w.hold)
	a := <-queued
	<-heldDone
	if a.resp.StatusCode != http.StatusOK {
		t.Fatalf("queued request: status %d", a.resp.StatusCode)
	}

	series := map[string]string{"worker": "gpu0", "model": "m"}
	n, ttft := histogram(t, r, "sluice_ttft_seconds", series)
	wn, worker := histogram(t, r, "sluice_worker_ttft_seconds", series)
	if n != 1 || wn != 1 {
		t.Fatalf("sluice_ttft_seconds has %d samples and sluice_worker_ttft_seconds %d; want the streamed request's one each", n, wn)
	}
	g, err := http.Get(r.url + "/debug/decisions/" + a.resp.Header.Get("X-Sluice-Decision"))
	if err != nil {
		t.Fatal(err)
	}
	var rec decisions.Record
	if err := json.Unmarshal([]byte(readAll(t, g)), &rec); err != nil {
		t.Fatal(err)
	}
	wait := rec.QueueWaitMs / 1000
	if !(wait > 0) {
		t.Fatalf("queued request's record says it waited %v ms; want a wait", rec.QueueWaitMs)
	}
	if ttft-worker < wait {
		t.Errorf("sluice_ttft_seconds %.6f − sluice_worker_ttft_seconds %.6f < queue wait %.6f: the client's view must hold the wait on top of the worker's share", ttft, worker, wait)
	}
	if after := a.end.Sub(release).Seconds(); !(worker > 0) || worker > after {
		t.Errorf("sluice_worker_ttft_seconds %.6f: want it within the %.6f s after the worker was released, none of the queue", worker, after)
	}

	ft, ok := rec.FirstToken()
	if !ok {
		t.Fatalf("decision %s has no first token", rec.ID)
	}
	for _, c := range []struct {
		field    string
		got      float64
		wantSecs float64
	}{
		{"ttft_ms", ft.TTFTMs, ttft},
		{"worker_ttft_ms", ft.WorkerTTFTMs, worker},
	} {
		if math.Abs(c.got-1000*c.wantSecs) > 1e-6 {
			t.Errorf("record %s = %v, the metric %v ms", c.field, c.got, 1000*c.wantSecs)
		}
	}
}
