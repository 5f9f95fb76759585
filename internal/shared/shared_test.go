package shared

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/redistest"
)

var workers4 = []string{"w0", "w1", "w2", "w3"}

type ledgerOpts struct {
	ttl, renew time.Duration
	replicas   int
	call       time.Duration // CallTimeout; the default when 0
}

func newLedger(t testing.TB, url, replica string, o ledgerOpts) *Ledger {
	t.Helper()
	rdb, prefix, err := redisconn.Open(url, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	if o.ttl == 0 {
		o.ttl, o.renew = time.Hour, 30*time.Minute // tests that run no renewals
	}
	l, err := New(Config{Client: rdb, Prefix: prefix, Replica: replica, LeaseTTL: o.ttl, RenewEvery: o.renew, Replicas: o.replicas, CallTimeout: o.call})
	if err != nil {
		t.Fatal(err)
	}
	l.subscribed = make(chan struct{})
	return l
}

// run starts l.Run until the test ends and waits until it listens.
func run(t *testing.T, l *Ledger) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-l.subscribed
	return cancel
}

func cands(limit int, names ...string) []Candidate {
	out := make([]Candidate, len(names))
	for i, n := range names {
		out[i] = Candidate{Worker: n, ActiveWeight: 1, Limit: limit}
	}
	return out
}

// eventually polls cond until it holds, failing the test after a bounded
// deadline: the state it waits for is in Redis, with no event to wait on.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inFlight(t *testing.T, l *Ledger, workers ...string) []int {
	t.Helper()
	n, err := l.InFlight(context.Background(), workers...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReserve_CrossReplicaBurstOnePerWorker(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	ls := []*Ledger{
		newLedger(t, srv.URL(0), "r0", ledgerOpts{}),
		newLedger(t, srv.URL(0), "r1", ledgerOpts{}),
		newLedger(t, srv.URL(0), "r2", ledgerOpts{}),
	}
	for round := range 200 {
		start := make(chan struct{})
		got := make([]Reservation, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i], errs[i] = ls[i%3].Reserve(ctx, "m", "", cands(4, workers4...))
			}()
		}
		close(start)
		wg.Wait()
		var chosen []string
		for i, r := range got {
			if errs[i] != nil {
				t.Fatalf("round %d: request %d: %v", round, i, errs[i])
			}
			chosen = append(chosen, r.Worker)
		}
		slices.Sort(chosen)
		if !slices.Equal(chosen, workers4) {
			t.Fatalf("round %d: four simultaneous requests on three replicas landed on %v, want one per worker", round, chosen)
		}
		for i, r := range got {
			if err := ls[i%3].Release(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := inFlight(t, ls[0], workers4...); !slices.Equal(n, []int{0, 0, 0, 0}) {
		t.Fatalf("in flight after releasing everything: %v", n)
	}
}

func TestReserve_NeverOverLimitAcrossReplicas(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	const limit = 2
	var live [4]atomic.Int32
	var over atomic.Int32
	var wg sync.WaitGroup
	for r := range 3 {
		l := newLedger(t, srv.URL(0), fmt.Sprintf("r%d", r), ledgerOpts{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 150 {
					res, err := l.Reserve(ctx, "m", "", cands(limit, workers4...))
					if errors.Is(err, ErrFull) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					if live[res.Index].Add(1) > limit {
						over.Add(1)
					}
					live[res.Index].Add(-1)
					if err := l.Release(ctx, res); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if n := over.Load(); n > 0 {
		t.Fatalf("%d reservations found their worker over its limit of %d", n, limit)
	}
}

func TestReserve_LowestTotalThenLeastRecentlyPickedThenOrder(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	a := newLedger(t, srv.URL(0), "a", ledgerOpts{})
	b := newLedger(t, srv.URL(0), "b", ledgerOpts{})
	c := []Candidate{
		{Worker: "x", Score: 1, ActiveWeight: 10, Limit: 10},
		{Worker: "y", Score: 1, ActiveWeight: 10, Limit: 10},
		{Worker: "z", Score: 0.5, ActiveWeight: 10, Limit: 1},
	}
	// z has the lowest score; then z is full; x and y tie, never picked:
	// the first listed; then y is the least recently picked, by either
	// replica; then both have one in flight and x was picked first.
	var got []string
	for i := range 4 {
		l := []*Ledger{a, b}[i%2]
		r, err := l.Reserve(ctx, "m", "", c)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Worker)
	}
	if want := []string{"z", "x", "y", "x"}; !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
	if _, err := a.Reserve(ctx, "m", "", []Candidate{c[2]}); !errors.Is(err, ErrFull) {
		t.Fatalf("reserve on a full worker: %v, want ErrFull", err)
	}
}

// The candidates reach the script packed (packCandidates): names of every
// header length and numbers one ulp apart must arrive intact, the tie
// between the lowest totals must be settled among exactly those tied, and
// the counts must be the same whether the script reads the whole count
// hash or only the candidates' fields.
func TestReserve_PackedCandidatesPickExactly(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	name := func(prefix string, n int) string { return prefix + strings.Repeat("x", n-len(prefix)) }
	tests := []struct {
		name   string
		busy   map[string]int // slots reserved first, worker by worker
		cands  []Candidate
		picks  []string // successive picks, none released
		active []int    // the first pick's shared counts
	}{
		{
			name: "counts of two among many busy workers",
			busy: map[string]int{"s": 2, "o1": 1, "o2": 1, "o3": 1, "o4": 1, "o5": 3},
			cands: []Candidate{
				{Worker: "s", Score: 0, ActiveWeight: 1, Limit: 9},
				{Worker: "t", Score: 1.5, ActiveWeight: 1, Limit: 9},
			},
			// totals s 2, 2, 3; t 1.5, 2.5, 2.5
			picks:  []string{"t", "s", "t"},
			active: []int{2, 0},
		},
		{
			name: "counts of two busy workers and an idle one",
			busy: map[string]int{"s": 2, "t": 1},
			cands: []Candidate{
				{Worker: "r", Score: 3.5, ActiveWeight: 1, Limit: 9},
				{Worker: "s", Score: 0, ActiveWeight: 1, Limit: 9},
				{Worker: "t", Score: 1.5, ActiveWeight: 1, Limit: 9},
			},
			// totals r 3.5, 3.5; s 2, 3; t 2.5, 2.5
			picks:  []string{"s", "t", "s"},
			active: []int{0, 2, 1},
		},
		{
			name: "names of 31, 32, 300 and 70000 bytes",
			cands: []Candidate{
				{Worker: name("a", 31), Score: 4, Limit: 1},
				{Worker: name("b", 32), Score: 3, Limit: 1},
				{Worker: name("c", 300), Score: 2, Limit: 1},
				{Worker: name("d", 70000), Score: 1, Limit: 1},
				{Worker: "gpü-é", Score: 5, Limit: 1},
			},
			picks: []string{name("d", 70000), name("c", 300), name("b", 32), name("a", 31), "gpü-é"},
		},
		{
			name: "scores one ulp apart",
			cands: []Candidate{
				{Worker: "p", Score: math.Nextafter(0.3, 1), Limit: 1},
				{Worker: "q", Score: 0.3, Limit: 1},
			},
			picks: []string{"q", "p"},
		},
		{
			name: "weight times the shared count",
			cands: []Candidate{
				{Worker: "u", Score: 0, ActiveWeight: 1.5, Limit: 3},
				{Worker: "v", Score: 1.25, ActiveWeight: 0.5, Limit: 3},
			},
			// totals u 0, 1.5, 3, full; v 1.25, 1.75, 2.25, full
			picks: []string{"u", "v", "u", "v", "v", "u"},
		},
		{
			name: "ties among the lowest only, wherever they stand",
			cands: []Candidate{
				{Worker: "e", Score: 2, Limit: 9},
				{Worker: "f", Score: 2, Limit: 9},
				{Worker: "g", Score: 1, Limit: 9},
				{Worker: "h", Score: 2, Limit: 9},
				{Worker: "i", Score: 1, Limit: 9},
			},
			picks: []string{"g", "i", "g", "i"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(t, srv.URL(i), "a", ledgerOpts{})
			for w, n := range tt.busy {
				for range n {
					if _, err := l.Reserve(ctx, "m", "", cands(9, w)); err != nil {
						t.Fatal(err)
					}
				}
			}
			var got []string
			for j := range tt.picks {
				r, err := l.Reserve(ctx, "m", "", tt.cands)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, r.Worker)
				if j == 0 && tt.active != nil && !slices.Equal(r.Active, tt.active) {
					t.Errorf("shared counts before the first pick %v, want %v", r.Active, tt.active)
				}
			}
			if !slices.Equal(got, tt.picks) {
				t.Fatalf("picks %v, want %v", got, tt.picks)
			}
		})
	}
}

func TestWait_OldestRequestOfAnyReplicaBindsFirst(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	r2 := newLedger(t, srv.URL(0), "r2", ledgerOpts{})
	run(t, r1)
	one := cands(1, "w0")
	held, err := r0.Reserve(ctx, "m", "", one)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Wait(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	if err := r2.Wait(ctx, "m", "b"); err != nil {
		t.Fatal(err)
	}
	if err := r0.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	<-r1.Wake() // the release reached r1 through pub/sub (renewals are an hour apart)
	if _, err := r2.Reserve(ctx, "m", "b", one); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("younger waiter of r2: %v, want ErrNotYourTurn", err)
	}
	if _, err := r0.Reserve(ctx, "m", "", one); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("new request on r0 while others wait: %v, want ErrNotYourTurn", err)
	}
	first, err := r1.Reserve(ctx, "m", "a", one)
	if err != nil {
		t.Fatalf("oldest waiter: %v", err)
	}
	if err := r1.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Reserve(ctx, "m", "b", one); err != nil {
		t.Fatalf("r2's waiter, now the oldest: %v", err)
	}
}

// TestWait_BoundWaiterWakesTheNextTurn: a waiter bound by its pick hands
// the turn to the replica with the next oldest waiter, which is woken at
// once, not at the next release: with two slots free and one wake-up
// between them, the second slot would otherwise idle.
func TestWait_BoundWaiterWakesTheNextTurn(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	run(t, r1)
	two := cands(1, "w0", "w1")
	if err := r0.Wait(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	if err := r1.Wait(ctx, "m", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := r1.Reserve(ctx, "m", "b", two); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("r1's younger waiter: %v, want ErrNotYourTurn", err)
	}
	if _, err := r0.Reserve(ctx, "m", "a", two); err != nil {
		t.Fatalf("r0's oldest waiter: %v", err)
	}
	select {
	case <-r1.Wake(): // renewals are an hour apart: only pub/sub wakes it
	case <-time.After(10 * time.Second):
		t.Fatal("r1, whose waiter is now the oldest, was not woken")
	}
	if _, err := r1.Reserve(ctx, "m", "b", two); err != nil {
		t.Fatalf("r1's waiter, now the oldest: %v", err)
	}
}

// TestRenew_RemovesWhatLeftWhileDegraded: a lease released and a waiter
// gone while Redis could not be told are removed at the first renewal
// that reaches it. Left to expire, the lease would hold its slot and the
// waiter, the oldest, every other replica's turn for up to LeaseTTL.
func TestRenew_RemovesWhatLeftWhileDegraded(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	one := cands(1, "w0")
	held, err := r0.Reserve(ctx, "m", "", one)
	if err != nil {
		t.Fatal(err)
	}
	if err := r0.Wait(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	r0.degraded.Store(true) // as after a call that timed out
	if err := r0.Release(ctx, held); !errors.Is(err, ErrDegraded) {
		t.Fatalf("release while degraded: %v, want ErrDegraded", err)
	}
	if err := r0.Unwait(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	r0.renew(ctx)
	if r0.Degraded() {
		t.Fatal("still degraded after a renewal that reached Redis")
	}
	if n := inFlight(t, r1, "w0"); n[0] != 0 {
		t.Fatalf("w0 in flight after the renewal: %d, want 0 (the lease was released)", n[0])
	}
	if _, err := r1.Reserve(ctx, "m", "", one); err != nil {
		t.Fatalf("r1 on the free worker: %v (a gone waiter still holds the turn?)", err)
	}
}

// TestWait_QueueOrderCannotDeadlockReplicas: a replica's queue need not
// place its oldest request first (a cheaper one may overtake it within
// max_overtake), so the turn belongs to the replica holding the oldest
// waiter, whichever of its requests it places. Were it each request's own
// age, r0 placing its younger a2 would wait for r1's b1, and r1 placing
// b2 for r0's a1: neither would ever bind.
func TestWait_QueueOrderCannotDeadlockReplicas(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	for _, w := range []struct {
		l  *Ledger
		id string
	}{{r0, "a1"}, {r1, "b1"}, {r0, "a2"}, {r1, "b2"}} {
		if err := w.l.Wait(ctx, "m", w.id); err != nil {
			t.Fatal(err)
		}
	}
	one := cands(1, "w0", "w1")
	if _, err := r1.Reserve(ctx, "m", "b2", one); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("r1's b2 while r0's a1 is the oldest waiter: %v, want ErrNotYourTurn", err)
	}
	if _, err := r0.Reserve(ctx, "m", "a2", one); err != nil {
		t.Fatalf("r0 holds the oldest waiter, its queue picked a2: %v, want a reservation", err)
	}
	if _, err := r1.Reserve(ctx, "m", "b2", one); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("r1's b2 while r0's a1 still waits: %v, want ErrNotYourTurn", err)
	}
	if _, err := r0.Reserve(ctx, "m", "a1", one); err != nil {
		t.Fatalf("r0's a1: %v", err)
	}
	if _, err := r1.Reserve(ctx, "m", "b2", one); !errors.Is(err, ErrFull) {
		t.Fatalf("r1's b2 once r0 waits no more, the two workers taken: %v, want ErrFull", err)
	}
}

// TestWait_BoundDuringRenewalLeavesNoWaiter binds a waiter between a
// renewal's snapshot of the waiters and its script, which re-creates
// every waiter of the snapshot that Redis lacks: the bound one must not
// stay on the list, where it would hold the other replicas' turn until it
// expired.
func TestWait_BoundDuringRenewalLeavesNoWaiter(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	if err := r0.Wait(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	r0.beforeRenew = func() {
		if _, err := r0.Reserve(ctx, "m", "a", cands(1, "w0")); err != nil {
			t.Errorf("reserve during the renewal: %v", err)
		}
	}
	r0.renew(ctx)
	r0.beforeRenew = nil
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if n, err := rdb.ZCard(ctx, "sluice:shared:wait:m").Result(); err != nil || n != 0 {
		t.Fatalf("waiting list holds %d members after the waiter was bound (err %v), want 0", n, err)
	}
	if _, err := r1.Reserve(ctx, "m", "", cands(1, "w1")); err != nil {
		t.Fatalf("r1 once r0 waits no more: %v", err)
	}
}

func TestWait_AbandonedWaiterStopsBlocking(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{ttl: 300 * time.Millisecond, renew: 50 * time.Millisecond})
	if err := r1.Wait(ctx, "m", "gone"); err != nil { // r1 never renews: it died
		t.Fatal(err)
	}
	if _, err := r0.Reserve(ctx, "m", "", cands(1, "w0")); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("reserve behind a live waiter: %v, want ErrNotYourTurn", err)
	}
	eventually(t, "the dead replica's waiter to expire", func() bool {
		_, err := r0.Reserve(ctx, "m", "", cands(1, "w0"))
		return err == nil
	})
	// r0 itself unwaiting wakes nobody harmfully and is idempotent.
	if err := r0.Unwait(ctx, "m", "never"); err != nil {
		t.Fatal(err)
	}
}

func TestLease_StoppedReplicaCapacityReturnsAfterTTL(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	opts := ledgerOpts{ttl: time.Second, renew: 100 * time.Millisecond}
	dying := newLedger(t, srv.URL(0), "dying", opts)
	stop := run(t, dying)
	for range 4 {
		if _, err := dying.Reserve(ctx, "m", "", cands(1, workers4...)); err != nil {
			t.Fatal(err)
		}
	}
	other := newLedger(t, srv.URL(0), "other", opts)
	rdb := other.rdb
	key := other.leasesKey()
	first := zscoreOnly(t, rdb, key)
	eventually(t, "a renewal to extend the leases", func() bool { return zscoreOnly(t, rdb, key) > first })
	stop()            // the renew loop stops
	dying.rdb.Close() // and the connection drops, with nothing released
	if _, err := other.Reserve(ctx, "m", "", cands(1, workers4...)); !errors.Is(err, ErrFull) {
		t.Fatalf("reserve while the dead replica's leases live: %v, want ErrFull", err)
	}
	eventually(t, "the dead replica's leases to expire", func() bool {
		return slices.Equal(inFlight(t, other, workers4...), []int{0, 0, 0, 0})
	})
	for range 4 {
		if _, err := other.Reserve(ctx, "m", "", cands(1, workers4...)); err != nil {
			t.Fatalf("capacity did not come back: %v", err)
		}
	}
}

func zscoreOnly(t *testing.T, rdb *redis.Client, key string) float64 {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(context.Background(), key, 0, 0).Result() // the soonest to expire
	if err != nil || len(zs) != 1 {
		t.Fatalf("lease set %s: %v %v", key, zs, err)
	}
	return zs[0].Score
}

// TestHelperProcess is not a test: TestLease_KilledProcessCapacityReturns
// runs the test binary again as a replica that holds leases until killed.
func TestHelperProcess(t *testing.T) {
	url := os.Getenv("SLUICE_SHARED_HELPER_REDIS")
	if url == "" {
		t.Skip("helper process for TestLease_KilledProcessCapacityReturns")
	}
	l := newLedger(t, url, "child", ledgerOpts{ttl: time.Second, renew: 100 * time.Millisecond})
	go l.Run(context.Background())
	for range 4 {
		if _, err := l.Reserve(context.Background(), "m", "", cands(1, workers4...)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	fmt.Println("held")
	select {} // until killed
}

func TestLease_KilledProcessCapacityReturns(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SLUICE_SHARED_HELPER_REDIS="+srv.URL(0))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		t.Fatalf("helper process: %q %v", line, err)
	}
	l := newLedger(t, srv.URL(0), "survivor", ledgerOpts{})
	if n := inFlight(t, l, workers4...); !slices.Equal(n, []int{1, 1, 1, 1}) {
		t.Fatalf("in flight while the helper holds every worker: %v", n)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup runs
		t.Fatal(err)
	}
	_ = cmd.Wait()
	eventually(t, "the killed process's leases to expire", func() bool {
		return slices.Equal(inFlight(t, l, workers4...), []int{0, 0, 0, 0})
	})
	if _, err := l.Reserve(ctx, "m", "", cands(1, workers4...)); err != nil {
		t.Fatal(err)
	}
}

func TestLedger_RedisRestartUnderLoad(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	opts := ledgerOpts{ttl: 2 * time.Second, renew: 50 * time.Millisecond, replicas: 2}
	ls := []*Ledger{newLedger(t, srv.URL(0), "r0", opts), newLedger(t, srv.URL(0), "r1", opts)}
	for _, l := range ls {
		run(t, l)
	}
	var ops, degradedOps atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	heldMu := sync.Mutex{}
	var held []struct {
		l *Ledger
		r Reservation
	}
	for _, l := range ls {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var cur *Reservation
				for !stop.Load() {
					if cur != nil {
						_ = l.Release(ctx, *cur) // fails only while degraded: the lease expires
						cur = nil
					}
					r, err := l.Reserve(ctx, "m", "", cands(2, workers4...))
					switch {
					case err == nil:
					case errors.Is(err, ErrDegraded):
						degradedOps.Add(1)
						r = l.Adopt(workers4[ops.Load()%4]) // the caller's local pick
					case errors.Is(err, ErrFull):
						ops.Add(1)
						continue
					default:
						t.Errorf("reserve: %v", err)
						return
					}
					ops.Add(1)
					cur = &r
				}
				if cur != nil {
					heldMu.Lock()
					held = append(held, struct {
						l *Ledger
						r Reservation
					}{l, *cur})
					heldMu.Unlock()
				}
			}()
		}
	}
	eventually(t, "load before the crash", func() bool { return ops.Load() > 200 })
	srv.Kill()
	eventually(t, "both replicas to notice Redis is gone", func() bool { return ls[0].Degraded() && ls[1].Degraded() })
	eventually(t, "load served while degraded", func() bool { return degradedOps.Load() > 50 })
	srv.Restart() // empty: nothing was persisted
	eventually(t, "both replicas to resynchronise", func() bool { return !ls[0].Degraded() && !ls[1].Degraded() })
	n := ops.Load()
	eventually(t, "load after the restart", func() bool { return ops.Load() > n+200 })
	stop.Store(true)
	wg.Wait()
	// Every lease a replica still holds is in Redis again — those taken
	// before the crash and those taken locally while degraded — and
	// nothing else is, once the replicas have renewed.
	for _, l := range ls {
		l.renew(ctx)
	}
	total := func() int {
		sum := 0
		for _, v := range inFlight(t, ls[0], workers4...) {
			sum += v
		}
		return sum
	}
	heldBy := func(l *Ledger) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.held)
	}
	if got, want := total(), heldBy(ls[0])+heldBy(ls[1]); got < want {
		t.Fatalf("Redis counts %d in flight, the replicas hold %d", got, want)
	}
	for _, h := range held {
		if err := h.l.Release(ctx, h.r); err != nil {
			t.Fatal(err)
		}
	}
	// Reservations whose reply was lost in the crash may linger until
	// their TTL; nothing stays longer.
	eventually(t, "every lease to be released or expire", func() bool { return total() == 0 })
}

func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t, redistest.Options{}) }

// TestRenew_ReconcilesWhatThisReplicaNoLongerHolds: a pick whose script ran
// but whose answer came too late is given up here while its lease stays
// in Redis, and a waiter can be left there that this replica no longer
// queues (a renewal re-adding one a Reserve bound meanwhile, say). The
// next renewal removes both, and nothing this replica still holds, nor
// another replica's, nor a lease numbered after what it saw issued.
func TestRenew_ReconcilesWhatThisReplicaNoLongerHolds(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	r1 := newLedger(t, srv.URL(0), "r1", ledgerOpts{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()

	late, err := r0.Reserve(ctx, "m", "", cands(1, "w0"))
	if err != nil {
		t.Fatal(err)
	}
	r0.forget(late.Lease) // as when the answer times out after the script ran
	kept, err := r0.Reserve(ctx, "m", "", cands(1, "w1"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := r1.Reserve(ctx, "m", "", cands(1, "w2"))
	if err != nil {
		t.Fatal(err)
	}
	// A lease of r0 numbered after the last it issued: a Reserve of a
	// later renewal's time, which this one must leave alone.
	if err := rdb.ZAdd(ctx, "sluice:shared:leases", redis.Z{Score: 1e15, Member: "w3/r0/999"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HIncrBy(ctx, "sluice:shared:inflight", "w3", 1).Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"stray", "queued"} {
		if err := r0.Wait(ctx, "m", id); err != nil {
			t.Fatal(err)
		}
	}
	r0.mu.Lock()
	delete(r0.waiters, r0.member("stray")) // no longer queued here; Redis not told
	r0.mu.Unlock()

	if got := inFlight(t, r1, "w0", "w1", "w2", "w3"); !slices.Equal(got, []int{1, 1, 1, 1}) {
		t.Fatalf("before the renewal: in flight %v, want [1 1 1 1]", got)
	}
	r0.renew(ctx)
	if got := inFlight(t, r1, "w0", "w1", "w2", "w3"); !slices.Equal(got, []int{0, 1, 1, 1}) {
		t.Fatalf("after the renewal: in flight %v, want [0 1 1 1] (only the given-up lease gone)", got)
	}
	members, err := rdb.ZRange(ctx, "sluice:shared:wait:m", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"r0|queued"}; !slices.Equal(members, want) {
		t.Fatalf("waiting list after the renewal: %v, want %v", members, want)
	}
	if _, err := r1.Reserve(ctx, "m", "", cands(1, "w0")); !errors.Is(err, ErrNotYourTurn) {
		t.Fatalf("r1 while r0's queued request still waits: %v, want ErrNotYourTurn", err)
	}
	if err := r0.Unwait(ctx, "m", "queued"); err != nil {
		t.Fatal(err)
	}
	if _, err := r1.Reserve(ctx, "m", "", cands(1, "w0")); err != nil {
		t.Fatalf("r1 on w0, freed by the renewal: %v", err)
	}
	for _, r := range []struct {
		l   *Ledger
		res Reservation
	}{{r0, kept}, {r1, theirs}} {
		if err := r.l.Release(ctx, r.res); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptKeys records the keys of every script a client runs.
type scriptKeys struct {
	mu   sync.Mutex
	keys [][]string // per script run, in order
}

func (h *scriptKeys) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) >= 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			n := int(toInt(fmt.Sprint(a[2])))
			keys := make([]string, 0, n)
			for _, k := range a[3 : 3+n] {
				keys = append(keys, fmt.Sprint(k))
			}
			h.mu.Lock()
			h.keys = append(h.keys, keys)
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// take returns the distinct keys recorded since the last take, sorted.
func (h *scriptKeys) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, ks := range h.keys {
		out = append(out, ks...)
	}
	h.keys = nil
	slices.Sort(out)
	return slices.Compact(out)
}

// TestRenew_ForgetsModelsNothingWaitsFor: requests for many distinct
// models that have all left (bound, gone, or names no worker serves)
// leave the ledger's set of models as it was, so a renewal sends the
// keys of the models still waited for and no more: were every model
// ever queued for kept, each renewal would grow with the names clients
// invented.
func TestRenew_ForgetsModelsNothingWaitsFor(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	r0 := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	rec := &scriptKeys{}
	r0.rdb.AddHook(rec)
	for i := range 200 {
		model, id := fmt.Sprintf("gone-%d", i), fmt.Sprintf("g%d", i)
		if err := r0.Wait(ctx, model, id); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := r0.Unwait(ctx, model, id); err != nil {
				t.Fatal(err)
			}
		} else if _, err := r0.Reserve(ctx, model, id, cands(1000, "w0")); err != nil { // bound
			t.Fatal(err)
		}
	}
	if err := r0.Wait(ctx, "kept", "k"); err != nil {
		t.Fatal(err)
	}
	r0.renew(ctx) // the last to look at the models left: nothing of them is left in Redis
	r0.mu.Lock()
	models := slices.Sorted(maps.Keys(r0.models))
	r0.mu.Unlock()
	if want := []string{"kept"}; !slices.Equal(models, want) {
		t.Fatalf("models after the renewal: %d of them (%v...), want %v", len(models), models[:min(3, len(models))], want)
	}
	rec.take()
	r0.renew(ctx)
	want := []string{"sluice:shared:inflight", "sluice:shared:leases", "sluice:shared:wait:kept", "sluice:shared:waitexp:kept"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("a renewal touched %d keys (%v...), want %v", len(got), got[:min(6, len(got))], want)
	}
}
