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
// loopback across 64 workers, each with a slot already taken (the script
// reads 64 in-flight counts and the last picks of the tied), timing every
// call; the release is outside the timing. It reports the p50 and p99 of
// the calls in µs, and Redis's own time per script call.
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
	// A slot taken on every worker, so each has a count to read.
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
	// The scripts' own run time inside Redis, free of the client's and
	// the network's scheduling: Redis's mean per call of EVALSHA (both
	// the pick and the release script).
	calls, usec := evalshaStats(b, l)
	b.ReportMetric(float64(usec)/float64(calls), "redis-evalsha-µs")
	// The pick script's alone, over rounds of as many picks as workers,
	// each released after the round: each worker gets one more slot, within
	// its limit.
	calls, usec = 0, 0
	held := make([]Reservation, 0, benchWorkers)
	for range 16 {
		if err := l.rdb.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		for range benchWorkers {
			r, err := l.Reserve(ctx, "m", "", cs)
			if err != nil {
				b.Fatal(err)
			}
			held = append(held, r)
		}
		c, u := evalshaStats(b, l)
		calls, usec = calls+c, usec+u
		for _, r := range held {
			if err := l.Release(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
		held = held[:0]
	}
	b.ReportMetric(float64(usec)/float64(calls), "redis-pick-µs")
}

// evalshaStats is how many EVALSHA Redis ran since its statistics were
// last reset, and their total run time in µs.
func evalshaStats(b *testing.B, l *Ledger) (calls, usec int64) {
	b.Helper()
	info, err := l.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &calls
			case "usec":
				dst = &usec
			default:
				continue
			}
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				b.Fatalf("commandstats: %q: %v", line, err)
			}
		}
		if calls > 0 {
			return calls, usec
		}
	}
	b.Fatalf("commandstats: no EVALSHA in %q", info)
	return 0, 0
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
