package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// bindLog records the order in which tickets are bound.
type bindLog struct {
	mu    sync.Mutex
	names []string
}

func (b *bindLog) notify(name string) func(*Ticket) {
	return func(t *Ticket) {
		if l, _ := t.Result(); l != nil {
			b.mu.Lock()
			b.names = append(b.names, name)
			b.mu.Unlock()
		}
	}
}

// serveAll releases each bound lease in turn until every ticket is done,
// so the worker takes the queue one request at a time.
func serveAll(t *testing.T, held *Lease, tickets []*Ticket) {
	t.Helper()
	held.Release()
	for range tickets {
		var next *Lease
		for _, tk := range tickets {
			if l, err := tk.Result(); tk.Done() && err == nil && !l.released.Load() {
				next = l
			}
		}
		if next == nil {
			break
		}
		next.Release()
	}
	for i, tk := range tickets {
		if !tk.Done() {
			t.Fatalf("ticket %d never bound", i)
		}
	}
}

// One tenant's burst of large requests must not starve another tenant's
// few small ones: fair share is by token cost, so B's requests, costing a
// tenth of A's, go in before A's second.
func TestScheduler_FairShareBetweenTenantsByTokenCost(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 200}, workers(1, 1, "m")...)
	held, _ := s.Submit(Request{Model: "m", Tenant: "a", PromptTokens: 4000, MaxTokens: 100}, nil).Result()
	var log bindLog
	var tickets []*Ticket
	for i := range 100 {
		tickets = append(tickets, s.Submit(Request{Model: "m", Tenant: "a", PromptTokens: 4000, MaxTokens: 100}, log.notify(fmt.Sprint("a", i))))
	}
	for i := range 5 {
		tickets = append(tickets, s.Submit(Request{Model: "m", Tenant: "b", PromptTokens: 300, MaxTokens: 100}, log.notify(fmt.Sprint("b", i))))
	}
	serveAll(t, held, tickets)
	lastB := slices.Index(log.names, "b4")
	aBefore := 0
	for _, n := range log.names[:lastB] {
		if strings.HasPrefix(n, "a") {
			aBefore++
		}
	}
	if aBefore > 1 {
		t.Fatalf("%d of A's requests bound before B's last; want at most 1. Order: %v", aBefore, log.names[:lastB+1])
	}
}

func TestScheduler_TenantWeightsShareByCost(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 200, TenantWeights: map[string]float64{"gold": 3}}, workers(1, 1, "m")...)
	held, _ := s.Submit(Request{Model: "m"}, nil).Result()
	var log bindLog
	var tickets []*Ticket
	for i := range 40 {
		for _, tenant := range []string{"gold", "plain"} {
			tickets = append(tickets, s.Submit(Request{Model: "m", Tenant: tenant, PromptTokens: 100, MaxTokens: 100}, log.notify(tenant)))
			_ = i
		}
	}
	serveAll(t, held, tickets)
	gold := 0
	for _, n := range log.names[:40] {
		if n == "gold" {
			gold++
		}
	}
	if gold != 30 {
		t.Fatalf("gold got %d of the first 40 binds, want 30 (weight 3 to 1)", gold)
	}
}

func TestScheduler_ArrivalOrderWithinTenantByDefault(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, workers(1, 1, "m")...)
	held, _ := s.Submit(Request{Model: "m"}, nil).Result()
	var log bindLog
	tickets := []*Ticket{
		s.Submit(Request{Model: "m", PromptTokens: 5000}, log.notify("large")),
		s.Submit(Request{Model: "m", PromptTokens: 10}, log.notify("small")),
	}
	serveAll(t, held, tickets)
	if diff := cmp.Diff([]string{"large", "small"}, log.names); diff != "" {
		t.Fatalf("bind order (-want +got):\n%s", diff)
	}
}

func TestScheduler_RetriesStillGoFirst(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, workers(1, 1, "m")...)
	held, _ := s.Submit(Request{Model: "m"}, nil).Result()
	var log bindLog
	tickets := []*Ticket{
		s.Submit(Request{Model: "m", PromptTokens: 1}, log.notify("cheap")),
		s.Submit(Request{Model: "m", PromptTokens: 9000, Class: "batch", Attempt: 2}, log.notify("retry")),
	}
	serveAll(t, held, tickets)
	if diff := cmp.Diff([]string{"retry", "cheap"}, log.names); diff != "" {
		t.Fatalf("bind order (-want +got):\n%s", diff)
	}
}

// The drain rate behind Retry-After is measured only while requests wait:
// a release after an hour of idleness must not read as an hour per request.
func TestScheduler_RetryAfterIgnoresIdleSpell(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := newSched(t, Config{MaxQueue: 3, Clock: clock, QueueTimeout: time.Hour}, workers(1, 1, "m")...)
	held, queued := teachDrainRate(t, s, clock)
	for _, tk := range queued {
		s.Cancel(tk, ErrClientGone)
	}
	held.Release()
	clock.t = clock.t.Add(time.Hour) // idle
	l, _ := s.Submit(Request{Model: "m"}, nil).Result()
	clock.t = clock.t.Add(4 * time.Second)
	l.Release()
	s.Submit(Request{Model: "m"}, nil)
	for range 3 {
		s.Submit(Request{Model: "m"}, nil)
	}
	_, err := s.Submit(Request{Model: "m"}, nil).Result()
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err %v, want queue full", err)
	}
	if got, want := r.RetryAfter, 16*time.Second; got != want {
		t.Fatalf("retry-after %v after an idle hour, want %v (the rate measured under backlog)", got, want)
	}
}

func TestScheduler_UnknownModelsLeaveNoState(t *testing.T) {
	t.Run("known fleet", func(t *testing.T) {
		s := newSched(t, Config{MaxQueue: 5}, workers(1, 1, "m")...)
		s.Submit(Request{Model: "m"}, nil) // the worker is busy: others would queue
		for i := range 1000 {
			if _, err := s.Submit(Request{Model: fmt.Sprint("junk-", i)}, nil).Result(); !errors.Is(err, ErrUnknownModel) {
				t.Fatalf("err %v, want unknown model", err)
			}
		}
		if n := len(s.queues); n != 0 {
			t.Fatalf("%d queues after unknown models, want 0", n)
		}
	})
	t.Run("queue deleted when it empties", func(t *testing.T) {
		s := newSched(t, Config{MaxQueue: 5}, workers(1, 1, "m")...)
		held, _ := s.Submit(Request{Model: "m"}, nil).Result()
		tickets := []*Ticket{s.Submit(Request{Model: "m"}, nil), s.Submit(Request{Model: "m"}, nil)}
		if n := len(s.queues); n != 1 {
			t.Fatalf("%d queues with a backlog, want 1", n)
		}
		serveAll(t, held, tickets)
		if n := len(s.queues); n != 0 {
			t.Fatalf("%d queues once drained, want 0", n)
		}
	})
	t.Run("discovery shares one budget", func(t *testing.T) {
		src := newSource(snapshot.Snapshot{}) // models not discovered yet
		s := newSched(t, Config{MaxQueue: 4}, WorkerSpec{Name: "a", Source: src})
		var tickets []*Ticket
		for i := range 7 {
			tickets = append(tickets, s.Submit(Request{Model: fmt.Sprint("maybe-", i)}, nil))
		}
		for i, tk := range tickets {
			_, err := tk.Result()
			if i < 4 && tk.Done() {
				t.Fatalf("ticket %d refused within the budget: %v", i, err)
			}
			if i >= 4 && !errors.Is(err, ErrQueueFull) {
				t.Fatalf("ticket %d: err %v, want queue full past the shared budget", i, err)
			}
		}
		src.Set(snapshot.Snapshot{Models: []string{"m"}})
		s.Kick()
		for i, tk := range tickets[:4] {
			if _, err := tk.Result(); !errors.Is(err, ErrUnknownModel) {
				t.Fatalf("ticket %d: err %v, want unknown model once discovered", i, err)
			}
		}
		if n := len(s.queues); n != 0 {
			t.Fatalf("%d queues left, want 0", n)
		}
	})
}

// Requests waiting for a model whose every worker went away fail fast with
// no_healthy_worker when the fleet changes, instead of waiting out their
// timeout.
func TestScheduler_QueuedFailFastWhenNoWorkerLeft(t *testing.T) {
	tests := []struct {
		name   string
		change func(s *Scheduler, src *mutableSource)
	}{
		{"worker down", func(s *Scheduler, src *mutableSource) {
			src.Set(snapshot.Snapshot{Health: snapshot.HealthDown, HealthReason: "probe failed"})
			s.Kick()
		}},
		{"worker draining", func(s *Scheduler, _ *mutableSource) { s.SetDraining("a", true) }},
		{"worker removed", func(s *Scheduler, _ *mutableSource) { s.RemoveWorker("a") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSource(snapshot.Snapshot{Health: snapshot.HealthOK})
			s := newSched(t, Config{MaxQueue: 5}, WorkerSpec{Name: "a", Models: []string{"m"}, MaxConcurrency: 1, Source: src},
				WorkerSpec{Name: "b", Models: []string{"other"}, MaxConcurrency: 1})
			held, _ := s.Submit(Request{Model: "m"}, nil).Result()
			heldOther, _ := s.Submit(Request{Model: "other"}, nil).Result()
			queued := []*Ticket{s.Submit(Request{Model: "m"}, nil), s.Submit(Request{Model: "m", Class: "batch"}, nil)}
			other := s.Submit(Request{Model: "other"}, nil)
			tt.change(s, src)
			for i, tk := range queued {
				var r *Refusal
				if _, err := tk.Result(); !errors.As(err, &r) || r.Reason != "no_healthy_worker" {
					t.Fatalf("queued %d: err %v, want no_healthy_worker", i, err)
				}
			}
			if other.Done() {
				t.Fatal("a request for a model still served was refused")
			}
			if got := s.QueueDepth("m"); got != 0 {
				t.Fatalf("queue depth %d, want 0", got)
			}
			held.Release()
			heldOther.Release()
		})
	}
}

func TestScheduler_DeadlineUnmeetableRefusedAtOnce(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	classes := []Class{{Name: "interactive", MaxQueueWait: 10 * time.Second}, {Name: "batch", Priority: 1}}
	s := newSched(t, Config{MaxQueue: 10, Clock: clock, QueueTimeout: time.Hour, Classes: classes}, workers(1, 1, "m")...)
	teachDrainRate(t, s, clock) // 64 tokens/s; the worker stays busy, two wait
	// Each waiting request is 256 tokens, 4 s of drain: with 2 to 5 ahead
	// the wait is at most twice the deadline, with 6 ahead it is 24 s.
	for i := range 4 {
		if tk := s.Submit(Request{Model: "m"}, nil); tk.Done() {
			t.Fatalf("request %d refused: %v", i, tk.err)
		}
	}
	_, err := s.Submit(Request{Model: "m"}, nil).Result()
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(err, ErrDeadlineUnmeetable) || r.Reason != "deadline_unmeetable" {
		t.Fatalf("err %v, want deadline_unmeetable", err)
	}
	if got, want := r.RetryAfter, 14*time.Second; got != want {
		t.Fatalf("retry-after %v, want %v (24 s predicted - 10 s deadline)", got, want)
	}
	if tk := s.Submit(Request{Model: "m", Class: "batch"}, nil); tk.Done() {
		t.Fatalf("batch request, whose deadline is the hour-long queue timeout, refused: %v", tk.err)
	}
	if got, want := s.maxWait("interactive"), 10*time.Second; got != want {
		t.Fatalf("interactive deadline %v, want %v", got, want)
	}
}

// With fair share by session, a tenant's sessions share that tenant's
// part of the queue: ten sessions of tenant a against one of tenant b
// still bind a, b, a, b..., and a's turns go round its sessions. A client
// that invents session ids gains nothing over its tenant's share.
func TestScheduler_SessionsShareWithinTheirTenant(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 200}, workers(1, 1, "m")...)
	held, _ := s.Submit(Request{Model: "m"}, nil).Result()
	var log bindLog
	var tickets []*Ticket
	for i := range 10 {
		for range 5 {
			name := fmt.Sprint("a/s", i)
			tickets = append(tickets, s.Submit(Request{Model: "m", Tenant: "a", Flow: name, PromptTokens: 100, MaxTokens: 100}, log.notify(name)))
		}
	}
	for range 50 {
		tickets = append(tickets, s.Submit(Request{Model: "m", Tenant: "b", Flow: "b/s0", PromptTokens: 100, MaxTokens: 100}, log.notify("b/s0")))
	}
	serveAll(t, held, tickets)
	want := []string{"a/s0", "b/s0", "a/s1", "b/s0", "a/s2", "b/s0", "a/s3", "b/s0", "a/s4", "b/s0", "a/s5", "b/s0", "a/s6", "b/s0", "a/s7", "b/s0", "a/s8", "b/s0", "a/s9", "b/s0", "a/s0", "b/s0"}
	if diff := cmp.Diff(want, log.names[:len(want)]); diff != "" {
		t.Fatalf("bind order (-want +got):\n%s", diff)
	}
}
