package server

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkProxyOverhead measures a non-streamed request sent straight to
// a loopback worker and the same request through the router, and reports
// p50 and p99 latency of each; the difference is what Sluice adds.
func BenchmarkProxyOverhead(b *testing.B) {
	t := &testing.T{}
	w := newFakeWorker(t, "gpu0")
	defer w.srv.Close()
	cfg := testConfig(t, []*fakeWorker{w}, nil)
	cfg.Stats.Store = ""
	srv, err := New(cfg, Options{Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	hs := newLoopbackServer(srv.Handler())
	defer hs.Close()
	body := chat("bench", false)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, target := range []struct{ name, url string }{{"direct", w.srv.URL}, {"via-sluice", hs.URL}} {
		b.Run(target.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, target.url+"/v1/chat/completions", strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
