package shared

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/redistest"
)

// BenchmarkReserve64 measures one pick-and-reserve through Redis on
// loopback across 64 workers (the script reaps and counts 64 lease sets
// and reads the pick history), timing every call; the release is outside
// the timing. It reports the p50 and p99 of the calls in µs.
func BenchmarkReserve64(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	l := newLedger(b, srv.URL(0), "bench", ledgerOpts{})
	ctx := context.Background()
	cs := make([]Candidate, 64)
	for i := range cs {
		cs[i] = Candidate{Worker: fmt.Sprintf("w%02d", i), Score: float64(i%7) / 10, ActiveWeight: 1, Limit: 4}
	}
	// A few leases everywhere, so each set has members to reap and count.
	for range 64 {
		if _, err := l.Reserve(ctx, "m", "", cs); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		r, err := l.Reserve(ctx, "m", "", cs)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
