package shared

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/redistest"
)

// BenchmarkReserve64 measures one pick-and-reserve through Redis on
// loopback across 64 workers (the script reaps and counts 64 lease sets
// and reads the pick history), timing every call; the release is outside
// the timing. It reports the p50 and p99 of the calls in µs.
func BenchmarkReserve64(b *testing.B) {
	benchReserve(b, 64)
}

func benchReserve(b *testing.B, benchWorkers int) {
	srv := redistest.Start(b, redistest.Options{})
	l := newLedger(b, srv.URL(0), "bench", ledgerOpts{})
	ctx := context.Background()
	cs := make([]Candidate, benchWorkers)
	for i := range cs {
		cs[i] = Candidate{Worker: fmt.Sprintf("w%02d", i), Score: float64(i%7) / 10, ActiveWeight: 1, Limit: 4}
	}
	// A few leases everywhere, so each set has members to reap and count.
	for range benchWorkers {
		if _, err := l.Reserve(ctx, "m", "", cs); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
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
	// The script's own run time inside Redis, free of the client's and
	// the network's scheduling: Redis's mean per call of EVALSHA (both
	// the pick and the release script).
	info, err := l.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
			if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				b.ReportMetric(f, "redis-evalsha-µs")
			}
		}
	}
}

// BenchmarkPing is the floor under BenchmarkReserve64: one PING round trip
// to the same loopback Redis, timed and reported the same way.
func BenchmarkPing(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	l := newLedger(b, srv.URL(0), "bench", ledgerOpts{})
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		err := l.rdb.Ping(ctx).Err()
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

func BenchmarkReserve8(b *testing.B) { benchReserve(b, 8) }
