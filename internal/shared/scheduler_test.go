package shared

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/scheduler"
)

type replica struct {
	l     *Ledger
	sched *scheduler.Scheduler
	mu    sync.Mutex
	recs  []*decisions.Record
}

// newReplica builds a scheduler over four workers of limit 4 (unless
// workerLimit says otherwise) sharing l, with l's wake-ups kicking it.
func newReplica(t *testing.T, l *Ledger, workerLimit int, withRun bool) *replica {
	t.Helper()
	r := &replica{l: l}
	specs := make([]scheduler.WorkerSpec, len(workers4))
	for i, w := range workers4 {
		specs[i] = scheduler.WorkerSpec{Name: w, Models: []string{"m"}, MaxConcurrency: workerLimit}
	}
	var err error
	r.sched, err = scheduler.New(scheduler.Config{
		Weights: scheduler.DefaultWeights(), MaxQueue: 64, QueueTimeout: time.Minute,
		StaleAfter: time.Minute, Ledger: l.ForScheduler(context.Background()), IDPrefix: l.Replica(),
		Limits:   limit.Config{Fixed: true}, // limits as configured: the ledger is under test, not learning
		Recorder: func(rec *decisions.Record) { r.mu.Lock(); r.recs = append(r.recs, rec); r.mu.Unlock() },
	}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.sched.Close)
	if withRun {
		run(t, l)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-ctx.Done():
					return
				case <-l.Wake():
					r.sched.Kick()
				}
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
	}
	return r
}

func bound(t *testing.T, tk *scheduler.Ticket) *scheduler.Lease {
	t.Helper()
	select {
	case <-tk.Wait():
	case <-time.After(20 * time.Second):
		t.Fatal("ticket not bound within 20s")
	}
	lease, err := tk.Result()
	if err != nil {
		t.Fatalf("ticket refused: %v", err)
	}
	return lease
}

func TestScheduler_ThreeReplicasBurstOnePerWorker(t *testing.T) {
	srv := startRedis(t)
	rs := make([]*replica, 3)
	for i := range rs {
		rs[i] = newReplica(t, newLedger(t, srv.URL(0), fmt.Sprintf("r%d", i), ledgerOpts{}), 4, false)
	}
	for round := range 200 {
		start := make(chan struct{})
		leases := make([]*scheduler.Lease, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var err error
				leases[i], err = rs[i%3].sched.Admit(context.Background(), scheduler.Request{Model: "m", PromptTokens: 100})
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		var got []string
		for _, l := range leases {
			got = append(got, l.Worker)
		}
		slices.Sort(got)
		if !slices.Equal(got, workers4) {
			t.Fatalf("round %d: four requests on three replicas went to %v, want one per worker", round, got)
		}
		for _, l := range leases {
			l.Release()
		}
	}
	rec := rs[1].recs[len(rs[1].recs)-1]
	if rec.Replica != "r1" || rec.Degraded || rec.ID[:3] != "r1-" {
		t.Fatalf("record of r1: replica %q degraded %v id %q", rec.Replica, rec.Degraded, rec.ID)
	}
	// Ties between idle workers are broken by the ledger's pick sequence,
	// shared by the replicas: every record ranks first the worker chosen.
	for _, r := range rs {
		for _, rec := range r.recs {
			rec.Explain()
			for _, c := range rec.Candidates {
				if (c.Rank == 1) != (c.Worker == rec.Chosen) {
					t.Fatalf("record %s chose %s but ranks %s %d: %s", rec.ID, rec.Chosen, c.Worker, c.Rank, rec.Reason)
				}
			}
		}
	}
}

func TestScheduler_FreedSlotGoesToOldestRequestOfAnyReplica(t *testing.T) {
	srv := startRedis(t)
	a := newReplica(t, newLedger(t, srv.URL(0), "a", ledgerOpts{}), 1, true)
	b := newReplica(t, newLedger(t, srv.URL(0), "b", ledgerOpts{}), 1, true)
	c := newReplica(t, newLedger(t, srv.URL(0), "c", ledgerOpts{}), 1, true)
	req := scheduler.Request{Model: "m"}
	var held []*scheduler.Lease
	for range 4 { // a fills the fleet
		held = append(held, bound(t, a.sched.Submit(req, nil)))
	}
	// The ledger is asked outside the schedulers' locks: each request is
	// on the shared waiting list once its replica's calls are made.
	tb := b.sched.Submit(req, nil) // b's request queues first
	b.sched.FlushLedger()
	tc := c.sched.Submit(req, nil) // then c's
	c.sched.FlushLedger()
	ta := a.sched.Submit(req, nil) // then a's own
	a.sched.FlushLedger()
	for _, tk := range []*scheduler.Ticket{tb, tc, ta} {
		if tk.Done() {
			t.Fatal("a request was placed on a full fleet")
		}
	}
	held[0].Release() // a frees a slot: b's request is the oldest
	lb := bound(t, tb)
	a.sched.FlushLedger()
	c.sched.FlushLedger()
	if tc.Done() || ta.Done() {
		t.Fatal("a younger request took the freed slot")
	}
	held[1].Release()
	lc := bound(t, tc)
	a.sched.FlushLedger()
	if ta.Done() {
		t.Fatal("a's own request overtook c's older one")
	}
	held[2].Release()
	la := bound(t, ta)
	for _, l := range append(held[3:], lb, lc, la) {
		l.Release()
	}
	for _, r := range []*replica{a, b, c} {
		r.sched.FlushLedger()
	}
	if n := inFlight(t, a.l, workers4...); !slices.Equal(n, []int{0, 0, 0, 0}) {
		t.Fatalf("in flight after releasing everything: %v", n)
	}
}

func TestScheduler_RedisDownServesLocalShareThenResyncs(t *testing.T) {
	srv := startRedis(t)
	opts := ledgerOpts{ttl: 2 * time.Second, renew: 50 * time.Millisecond, replicas: 2}
	r := newReplica(t, newLedger(t, srv.URL(0), "r", opts), 4, true)
	srv.Stop()
	req := scheduler.Request{Model: "m"}
	var held []*scheduler.Lease
	for range 8 { // four workers, limit 4 over 2 replicas: 2 each here
		held = append(held, bound(t, r.sched.Submit(req, nil)))
	}
	ninth := r.sched.Submit(req, nil)
	if ninth.Done() {
		l, err := ninth.Result()
		t.Fatalf("a ninth request was placed beyond this replica's share: %v %v", l, err)
	}
	rec := held[len(held)-1].Decision
	if !rec.Degraded || rec.Replica != "r" {
		t.Fatalf("record while Redis is down: degraded %v replica %q, want degraded on r", rec.Degraded, rec.Replica)
	}
	srv.Restart()
	eventually(t, "the replica to resynchronise", func() bool { return !r.l.Degraded() })
	// Back on the shared view the fleet's whole limit counts again: the
	// ninth request gets a slot. And the reservations made while Redis
	// was down are in the ledger now.
	held = append(held, bound(t, ninth))
	other := newLedger(t, srv.URL(0), "other", ledgerOpts{})
	sum := 0
	for _, n := range inFlight(t, other, workers4...) {
		sum += n
	}
	if sum != 9 {
		t.Fatalf("shared in flight after Redis came back: %d, want the 9 this replica runs", sum)
	}
	for _, l := range held {
		l.Release()
	}
}

// levelReplica builds a scheduler over one worker w0 of the given limit
// sharing a Redis ledger named name on srv, on clock.
func levelReplica(t *testing.T, url, name string, workerLimit int, clock *clocktest.ManualClock) (*Ledger, *scheduler.Scheduler) {
	t.Helper()
	l := newLedger(t, url, name, ledgerOpts{})
	s, err := scheduler.New(scheduler.Config{
		Weights: scheduler.DefaultWeights(), MaxQueue: 8, QueueTimeout: time.Hour, StaleAfter: time.Hour,
		Ledger: l.ForScheduler(context.Background()), Clock: clock, Limits: limit.Config{Fixed: true},
	}, scheduler.WorkerSpec{Name: "w0", Models: []string{"m"}, MaxConcurrency: workerLimit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return l, s
}

// TestScheduler_ConcurrencyLevelCountsOtherReplicas: the level a stream's
// decode rate is filed under, which adaptive concurrency learns limits
// from, is the worker's in-flight count across replicas — what the card
// really ran — not this replica's share of it, as the ledger last reported
// it at this replica's picks. The record shows the count it scored.
func TestScheduler_ConcurrencyLevelCountsOtherReplicas(t *testing.T) {
	srv := startRedis(t)
	clock := clocktest.NewManualClock(time.Unix(1_700_000_000, 0))
	_, a := levelReplica(t, srv.URL(0), "a", 4, clock)
	_, b := levelReplica(t, srv.URL(0), "b", 4, clock)
	req := scheduler.Request{Model: "m"}
	a1, a2 := bound(t, a.Submit(req, nil)), bound(t, a.Submit(req, nil))
	b1 := bound(t, b.Submit(req, nil)) // the ledger says a has two on w0
	if ws := b.Workers()[0]; ws.Active != 1 || ws.OtherReplicas != 2 {
		t.Fatalf("b's view of w0: %d active here, %d at other replicas; want 1 and 2", ws.Active, ws.OtherReplicas)
	}
	if got := b1.Decision.Explain().Candidates[0].Active; got != 2 {
		t.Fatalf("b's record: w0 active %d, want the 2 the ledger scored", got)
	}
	clock.Advance(10 * time.Second)
	if got := b1.MeanConcurrency(); got != 3 {
		t.Fatalf("b's stream beside a's two: level %v, want 3", got)
	}
	a1.Release()
	a2.Release()
	a.FlushLedger()                    // the releases reach the ledger
	b2 := bound(t, b.Submit(req, nil)) // the ledger now says b alone: b1
	clock.Advance(10 * time.Second)
	if got := b1.MeanConcurrency(); got != 2.5 {
		t.Fatalf("b's stream: 10 s at 3, then 10 s at 2: level %v, want 2.5", got)
	}
	if got := b2.MeanConcurrency(); got != 2 {
		t.Fatalf("b's second stream: level %v, want 2", got)
	}
	b1.Release()
	b2.Release()
}

// TestScheduler_ConcurrencyLevelFromFullAndDegraded: a refusal because the
// worker is full carries the counts too, so a stream's level follows the
// fleet at its busiest; while Redis is down the level is this replica's
// own count, the only one it knows.
func TestScheduler_ConcurrencyLevelFromFullAndDegraded(t *testing.T) {
	srv := startRedis(t)
	clock := clocktest.NewManualClock(time.Unix(1_700_000_000, 0))
	_, a := levelReplica(t, srv.URL(0), "a", 3, clock)
	lb, b := levelReplica(t, srv.URL(0), "b", 3, clock)
	req := scheduler.Request{Model: "m"}
	b1 := bound(t, b.Submit(req, nil)) // alone on w0
	a1, a2 := bound(t, a.Submit(req, nil)), bound(t, a.Submit(req, nil))
	queued := b.Submit(req, nil) // w0 is full: the ledger says 3 in flight
	b.FlushLedger()
	if queued.Done() {
		t.Fatal("a fourth request was placed on a worker of limit 3")
	}
	clock.Advance(10 * time.Second)
	if got := b1.MeanConcurrency(); got != 3 {
		t.Fatalf("b's stream beside a's two, learnt from the full answer: level %v, want 3", got)
	}
	b.Cancel(queued, context.Canceled)
	srv.Stop()
	b2 := bound(t, b.Submit(req, nil)) // degraded: placed on b's local view
	if !lb.Degraded() {
		t.Fatal("the ledger is not degraded with Redis stopped")
	}
	clock.Advance(10 * time.Second)
	if got := b1.MeanConcurrency(); got != 2.5 {
		t.Fatalf("b's stream: 10 s at 3, then 10 s at b's own 2 while degraded: level %v, want 2.5", got)
	}
	for _, l := range []*scheduler.Lease{a1, a2, b1, b2} {
		l.Release()
	}
}

// TestScheduler_ReleaseHandsTheSlotToItsOwnQueue: a replica's release
// frees the shared slot before its queue is served, so its own oldest
// request takes the slot at once, as in one router, without waiting for
// the wake-up round trip (this replica gets none: no Run).
func TestScheduler_ReleaseHandsTheSlotToItsOwnQueue(t *testing.T) {
	srv := startRedis(t)
	clock := clocktest.NewManualClock(time.Unix(1_700_000_000, 0))
	_, s := levelReplica(t, srv.URL(0), "a", 1, clock)
	req := scheduler.Request{Model: "m"}
	first := bound(t, s.Submit(req, nil))
	queued := s.Submit(req, nil)
	s.FlushLedger()
	if queued.Done() {
		t.Fatal("a second request was placed on a worker of limit 1")
	}
	first.Release()
	s.FlushLedger()
	if !queued.Done() {
		t.Fatal("the queued request did not take the slot its replica's release freed")
	}
	bound(t, queued).Release()
}

// TestScheduler_RefusalRecordChoosesNobody: a request that timed out in
// the queue of one replica while the worker was full with another's is
// refused; its record, made on this replica's view where the worker looks
// free, must not name it as chosen nor replace the refusal's reason with
// a score.
func TestScheduler_RefusalRecordChoosesNobody(t *testing.T) {
	srv := startRedis(t)
	clock := clocktest.NewManualClock(time.Unix(1_700_000_000, 0))
	_, a := levelReplica(t, srv.URL(0), "a", 1, clock)
	var got *decisions.Record
	l := newLedger(t, srv.URL(0), "b", ledgerOpts{})
	b, err := scheduler.New(scheduler.Config{
		Weights: scheduler.DefaultWeights(), MaxQueue: 8, QueueTimeout: time.Hour, StaleAfter: time.Hour,
		Ledger: l.ForScheduler(context.Background()), Clock: clock, Limits: limit.Config{Fixed: true},
		Recorder: func(r *decisions.Record) { got = r },
	}, scheduler.WorkerSpec{Name: "w0", Models: []string{"m"}, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	req := scheduler.Request{Model: "m"}
	held := bound(t, a.Submit(req, nil))
	tk := b.Submit(req, nil)
	if !b.Cancel(tk, scheduler.ErrQueueTimeout) {
		t.Fatal("the request was not queued")
	}
	got.Explain()
	if got.Outcome != "queue_timeout" || got.Chosen != "" || got.Reason != scheduler.ErrQueueTimeout.Error() || got.Replica != "b" {
		t.Fatalf("refusal record: outcome %q chosen %q reason %q replica %q", got.Outcome, got.Chosen, got.Reason, got.Replica)
	}
	held.Release()
}

// Through a scheduler: requests for many made-up model names, queued
// while a worker's models are unknown, and requests that waited and are
// gone, leave a renewal sending the keys of the models waited for now
// and no more.
func TestScheduler_RenewalTouchesOnlyModelsWaitedFor(t *testing.T) {
	srv := startRedis(t)
	l := newLedger(t, srv.URL(0), "r0", ledgerOpts{})
	rec := &scriptKeys{}
	l.rdb.AddHook(rec)
	sched, err := scheduler.New(scheduler.Config{
		Weights: scheduler.DefaultWeights(), MaxQueue: 256, QueueTimeout: time.Minute,
		StaleAfter: time.Minute, Ledger: l.ForScheduler(context.Background()), IDPrefix: l.Replica(),
		Limits: limit.Config{Fixed: true},
	},
		scheduler.WorkerSpec{Name: "w0", Models: []string{"m", "n"}, MaxConcurrency: 1},
		scheduler.WorkerSpec{Name: "undiscovered", MaxConcurrency: 1}, // no models known yet
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	ctx := context.Background()
	held, err := sched.Admit(ctx, scheduler.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var queued []*scheduler.Ticket
	for i := range 100 {
		queued = append(queued, sched.Submit(scheduler.Request{Model: fmt.Sprintf("made-up-%d", i)}, nil))
	}
	gone := sched.Submit(scheduler.Request{Model: "n"}, nil) // waits behind m's lease, then leaves
	waiting := sched.Submit(scheduler.Request{Model: "m"}, nil)
	sched.FlushLedger()
	sched.Cancel(gone, scheduler.ErrClientGone)
	for _, tk := range queued[:50] {
		sched.Cancel(tk, scheduler.ErrClientGone)
	}
	sched.FlushLedger()
	l.renew(ctx)
	rec.take()
	l.renew(ctx)
	want := []string{"sluice:shared:inflight", "sluice:shared:leases", "sluice:shared:wait:m", "sluice:shared:waitexp:m"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("a renewal touched %d keys (%v...), want %v", len(got), got[:min(6, len(got))], want)
	}
	sched.Cancel(waiting, scheduler.ErrClientGone)
	for _, tk := range queued[50:] {
		sched.Cancel(tk, scheduler.ErrClientGone)
	}
	held.Release()
	sched.FlushLedger()
	l.renew(ctx)
	rec.take()
	l.renew(ctx)
	if got, want := rec.take(), []string{"sluice:shared:inflight", "sluice:shared:leases"}; !slices.Equal(got, want) {
		t.Fatalf("with nothing waiting a renewal touched %v, want %v", got, want)
	}
}
