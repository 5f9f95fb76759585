package vsim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/redistest"
	"github.com/sluice-router/sluice/internal/sim"
)

// TestRunHTTPStats_ThreeReplicasKeepTheFleetsLimits runs an overload (150%
// of capacity, so requests queue at every replica) through three routers
// sharing a real Redis behind the round-robin front, with a fixed limit of
// two per worker, below the workers' slots, so only the shared ledger
// keeps each worker at two: three routers each keeping its own count
// would put up to six on one. It checks that every request is accounted
// for — answered, sent by the front to one replica in turn, bound by
// exactly one decision of a replica naming itself, its reservation
// released — and that the replicas together never had more than two
// requests open on a worker, yet did reach two.
func TestRunHTTPStats_ThreeReplicasKeepTheFleetsLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time run")
	}
	rs := redistest.Start(t, redistest.Options{})
	fleet := sim.DemoFleet()
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1}, Count: 45, Seed: 5,
		Prompt: bench.Lengths{Median: 600, Sigma: 0.5, Min: 100, Max: 3000}, Output: bench.Lengths{Median: 80, Sigma: 0.5, Min: 10, Max: 300}})
	if err != nil {
		t.Fatal(err)
	}
	if items, err = AtRate(items, 1.5*Capacity(fleet, items)); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(fleet)
	cfg.Concurrency.Fixed, cfg.MaxConcurrency = true, 2
	// Nothing may time out in the queue, however loaded the machine: the
	// test counts requests, it does not time them.
	cfg.QueueTimeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, st, err := RunHTTPStats(ctx, HTTPConfig{Router: cfg, TimeScale: 20, Replicas: 3, Redis: rs.URL(0)}, items)
	if err != nil {
		t.Fatal(err)
	}
	if s := bench.Summarize(res, bench.SLO{}); len(res) != len(items) || s.OK != len(items) {
		t.Fatalf("%d results, %d ok of %d requests (errors %v)", len(res), s.OK, len(items), s.ErrorsByKind)
	}
	if len(st.Replicas) != 3 {
		t.Fatalf("%d replicas reported, want 3", len(st.Replicas))
	}
	sent, bound := 0, 0
	for i, r := range st.Replicas {
		if want := fmt.Sprintf("r%d", i+1); r.Name != want {
			t.Errorf("replica %d is named %q, want %q", i, r.Name, want)
		}
		// Round robin: 45 requests, 15 each.
		if r.Sent != len(items)/3 {
			t.Errorf("%s was sent %d requests, want %d", r.Name, r.Sent, len(items)/3)
		}
		if r.Misnamed != 0 || r.Degraded != 0 || r.Refused != 0 {
			t.Errorf("%s: %d records not naming it, %d degraded, %d refusals; want none", r.Name, r.Misnamed, r.Degraded, r.Refused)
		}
		sent += r.Sent
		bound += r.Bound
	}
	if sent != len(items) || bound != len(items) {
		t.Errorf("front sent %d, replicas bound %d, of %d requests", sent, bound, len(items))
	}
	reached := false
	for w, p := range st.PeakInFlight {
		if p > 2 {
			t.Errorf("%s had %d requests open at once across the replicas, over its limit of 2", w, p)
		}
		reached = reached || p >= 2
	}
	if !reached || len(st.PeakInFlight) != len(fleet) {
		t.Errorf("peaks %v: want every worker, at least one at its limit of 2 (an overload that never fills a worker checks nothing)", st.PeakInFlight)
	}
	if st.LeftInFlight != 0 {
		t.Errorf("the shared ledger still counts %d requests in flight after the run", st.LeftInFlight)
	}
	// The run's keys are gone: the next run starts from nothing.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	if keys, err := rdb.Keys(ctx, st.KeyPrefix+"*").Result(); err != nil || len(keys) != 0 || st.KeyPrefix == "" {
		t.Errorf("prefix %q: keys left %v (err %v)", st.KeyPrefix, keys, err)
	}
}
