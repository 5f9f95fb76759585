package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// gatedLedger is a Ledger whose Reserve for the models in gate blocks
// until the model's channel is closed; others answer at once. It reserves
// the lowest-scored candidate under its limit, counting its own leases.
type gatedLedger struct {
	gate map[string]chan struct{}

	mu       sync.Mutex
	inFlight map[string]int
	released []string
	asked    chan string // each Reserve's model, as it starts
}

func newGatedLedger(gated ...string) *gatedLedger {
	g := &gatedLedger{gate: map[string]chan struct{}{}, inFlight: map[string]int{}, asked: make(chan string, 64)}
	for _, m := range gated {
		g.gate[m] = make(chan struct{})
	}
	return g
}

func (g *gatedLedger) Reserve(model, waitID string, cands []SharedCandidate) (SharedPick, error) {
	g.asked <- model
	if ch := g.gate[model]; ch != nil {
		<-ch
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	pick := SharedPick{Index: -1, Active: make([]int, len(cands))}
	for i, c := range cands {
		n := g.inFlight[c.Worker]
		pick.Active[i] = n
		if n < c.Limit && (pick.Index < 0 || c.Score+c.ActiveWeight*float64(n) < cands[pick.Index].Score+c.ActiveWeight*float64(pick.Active[pick.Index])) {
			pick.Index = i
		}
	}
	if pick.Index < 0 {
		return pick, ErrLedgerBusy
	}
	w := cands[pick.Index].Worker
	g.inFlight[w]++
	pick.Lease = w
	return pick, nil
}

func (g *gatedLedger) Release(worker, lease string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight[worker]--
	g.released = append(g.released, lease)
}

func (g *gatedLedger) Adopt(worker string) string  { return worker }
func (g *gatedLedger) Wait(model, waitID string)   {}
func (g *gatedLedger) Unwait(model, waitID string) {}
func (g *gatedLedger) LocalLimit(limit int) int    { return limit }
func (g *gatedLedger) Replica() string             { return "r" }
func (g *gatedLedger) Degraded() bool              { return false }
func (g *gatedLedger) StateAge() time.Duration     { return 0 }

// A reservation the ledger is slow to answer holds up nothing but itself:
// while the ledger sits on model slow's answer, another model's request is
// bound, a request that needs no ledger is refused, the admission state
// is read and a lease is released, all without waiting for it; then the
// answer binds the slow request where the ledger chose.
func TestReserver_SlowLedgerHoldsUpOnlyItsOwnRequest(t *testing.T) {
	g := newGatedLedger("slow")
	s := newSched(t, Config{MaxQueue: 8, Ledger: g, Limits: limit.Config{Fixed: true}},
		WorkerSpec{Name: "a", Models: []string{"slow", "fast"}, MaxConcurrency: 2},
		WorkerSpec{Name: "b", Models: []string{"slow", "fast"}, MaxConcurrency: 2})
	slow := s.Submit(Request{Model: "slow"}, nil)
	if got := <-g.asked; got != "slow" {
		t.Fatalf("the ledger was asked about %q first, want slow", got)
	}
	if slow.Done() {
		t.Fatal("the slow request ended before the ledger answered")
	}
	fast, err := s.Admit(context.Background(), Request{Model: "fast"})
	if err != nil {
		t.Fatalf("another model's request: %v", err)
	}
	if _, err := s.Admit(context.Background(), Request{Model: "fast", Class: "nope"}); !errors.Is(err, ErrUnknownClass) {
		t.Fatalf("an unknown class: %v, want ErrUnknownClass", err)
	}
	if ws := s.Workers(); len(ws) != 2 || ws[0].Active+ws[1].Active != 2 {
		t.Fatalf("workers while the ledger answers: %+v; want the fast lease and the slow hold in flight", ws)
	}
	fast.Release()
	if slow.Done() {
		t.Fatal("the slow request ended before the ledger answered")
	}
	close(g.gate["slow"])
	<-slow.Wait()
	l, err := slow.Result()
	if err != nil {
		t.Fatalf("slow request: %v", err)
	}
	if l.Decision == nil || l.Decision.Chosen != l.Worker || !l.Decision.Explain().Candidates[0].Eligible {
		t.Fatalf("slow request's record: %+v", l.Decision)
	}
	l.Release()
	s.FlushLedger()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.released) != 2 || g.inFlight["a"]+g.inFlight["b"] != 0 {
		t.Fatalf("ledger after both released: released %v, in flight %v", g.released, g.inFlight)
	}
}

// A request whose client leaves while the ledger is answering is refused
// at once, and whatever the ledger then reserves for it is given back.
func TestReserver_CancelledWhileAskingGivesTheLeaseBack(t *testing.T) {
	g := newGatedLedger("m")
	s := newSched(t, Config{MaxQueue: 8, Ledger: g, Limits: limit.Config{Fixed: true}},
		WorkerSpec{Name: "a", Models: []string{"m"}, MaxConcurrency: 1})
	tk := s.Submit(Request{Model: "m"}, nil)
	<-g.asked
	if !s.Cancel(tk, ErrClientGone) {
		t.Fatal("a request waiting for the ledger could not be cancelled")
	}
	if _, err := tk.Result(); !errors.Is(err, ErrClientGone) {
		t.Fatalf("cancelled request: %v, want ErrClientGone", err)
	}
	close(g.gate["m"])
	s.FlushLedger()
	g.mu.Lock()
	released, n := append([]string(nil), g.released...), g.inFlight["a"]
	g.mu.Unlock()
	if len(released) != 1 || n != 0 {
		t.Fatalf("after the answer: released %v, in flight %d; want the lease given back", released, n)
	}
	if ws := s.Workers(); ws[0].Active != 0 {
		t.Fatalf("worker a: %d active after the cancelled reservation, want 0", ws[0].Active)
	}
	l, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatalf("the next request: %v", err)
	}
	l.Release()
}

// waitLedger is a gatedLedger that records the waiting list's calls.
type waitLedger struct {
	*gatedLedger
	mu    sync.Mutex
	calls []string // "wait model" or "unwait model", in order
}

func (w *waitLedger) Wait(model, waitID string) {
	w.mu.Lock()
	w.calls = append(w.calls, "wait "+model)
	w.mu.Unlock()
}

func (w *waitLedger) Unwait(model, waitID string) {
	w.mu.Lock()
	w.calls = append(w.calls, "unwait "+model)
	w.mu.Unlock()
}

func (w *waitLedger) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.calls
	w.calls = nil
	return out
}

// Requests for models no worker is known to serve — they wait only while
// some worker's models are unknown — stay off the shared waiting list,
// whose keys every renewal sends, so made-up model names cost the ledger
// nothing; once a worker shows it serves one, its queued requests join
// the list and the turn across replicas.
func TestLedger_WaitsOnlyForModelsTheFleetServes(t *testing.T) {
	g := &waitLedger{gatedLedger: newGatedLedger()}
	g.inFlight["b"] = 1 // b is full across replicas
	undiscovered := newSource(snapshot.Snapshot{})
	s := newSched(t, Config{MaxQueue: 64, Ledger: g},
		WorkerSpec{Name: "a", Models: []string{"m"}, MaxConcurrency: 1},
		WorkerSpec{Name: "b", Source: undiscovered, MaxConcurrency: 1})
	held, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	behind := s.Submit(Request{Model: "m"}, nil)
	var made []*Ticket
	for i := range 20 {
		made = append(made, s.Submit(Request{Model: fmt.Sprintf("made-up-%d", i)}, nil))
	}
	s.FlushLedger()
	if diff := cmp.Diff([]string{"wait m"}, g.take()); diff != "" {
		t.Fatalf("waiting-list calls while b's models are unknown (-want +got):\n%s", diff)
	}
	undiscovered.Set(snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"made-up-0"}})
	s.Kick()
	s.FlushLedger()
	if diff := cmp.Diff([]string{"wait made-up-0"}, g.take()); diff != "" {
		t.Fatalf("waiting-list calls once b serves made-up-0 (-want +got):\n%s", diff)
	}
	for _, tk := range append(made, behind) {
		s.Cancel(tk, ErrClientGone)
	}
	held.Release()
	s.FlushLedger()
	left := g.take() // each model's calls are in order, the two models' in either
	slices.Sort(left)
	if diff := cmp.Diff([]string{"unwait m", "unwait made-up-0"}, left); diff != "" {
		t.Fatalf("waiting-list calls as they leave (-want +got):\n%s", diff)
	}
}
