package scheduler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// loader is an AdapterLoader that records its loads and fails on the
// workers named in fail; gate, when set, holds every load until closed.
type loader struct {
	mu    sync.Mutex
	loads []string // "worker/adapter"
	fail  map[string]bool
	gate  chan struct{}
}

func (l *loader) LoadAdapter(ctx context.Context, worker string, a lora.Spec) error {
	if l.gate != nil {
		select {
		case <-l.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loads = append(l.loads, worker+"/"+a.Name)
	if l.fail[worker] {
		return errors.New("vLLM answered 400: no adapter found")
	}
	return nil
}

func (l *loader) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.loads)
}

func whyOf(l *Lease, worker string) string {
	for _, c := range l.Decision.Explain().Candidates {
		if c.Worker == worker {
			return c.Why
		}
	}
	return ""
}

func loraFleet(holder string, loads bool) []WorkerSpec {
	var out []WorkerSpec
	for _, n := range []string{"w0", "w1", "w2"} {
		snap := snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"base"}}
		if n == holder {
			snap.Adapters = []lora.Info{{Name: "sql", Base: "base"}}
		}
		out = append(out, WorkerSpec{Name: n, Models: []string{"base"}, MaxConcurrency: 1, Source: newSource(snap), LoadsAdapters: loads})
	}
	return out
}

// Without load on demand a request for an adapter goes only to the
// worker that holds it, and waits for it when it is full.
func TestAdapterFilter_OnlyHolders(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base"}}}}, loraFleet("w1", true)...)
	ctx := context.Background()
	l, err := s.Admit(ctx, Request{Model: "sql"})
	if err != nil || l.Worker != "w1" {
		t.Fatalf("sql on %v (%v), want w1, the only holder", l, err)
	}
	if why := whyOf(l, "w0"); !strings.Contains(why, `LoRA adapter "sql" not loaded (no load on demand)`) {
		t.Errorf("record says of w0 %q", why)
	}
	if a := l.Decision.Adapter; a == nil || a.State != "loaded" || a.Holders != 1 {
		t.Errorf("record's adapter = %+v, want loaded with 1 holder", a)
	}
	tk := s.Submit(Request{Model: "sql"}, nil)
	if tk.Done() {
		l2, _ := tk.Result()
		t.Fatalf("second request bound to %v while the holder is full; want it to wait", l2)
	}
	l.Release()
	<-tk.Wait()
	if l2, err := tk.Result(); err != nil || l2.Worker != "w1" {
		t.Fatalf("after the release: %v (%v), want w1", l2, err)
	}
	// The base model still goes anywhere.
	if lb, err := s.Admit(ctx, Request{Model: "base"}); err != nil || lb.Worker == "w1" {
		t.Fatalf("base on %v (%v), want a free worker", lb, err)
	}
}

// With load on demand a request goes to a holder with room; when the
// holders are full it loads the adapter on another worker, until
// max_replicas workers hold it; requests bound to a loading worker wait
// for the one load.
func TestAdapterFilter_LoadOnDemandBounded(t *testing.T) {
	ld := &loader{gate: make(chan struct{})}
	s := newSched(t, Config{MaxQueue: 8, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base", Path: "/a/sql"}},
		LoadOnDemand: true, MaxReplicas: 2, Loader: ld}}, loraFleet("w1", true)...)
	ctx := context.Background()
	l1, err := s.Admit(ctx, Request{Model: "sql"})
	if err != nil || l1.Worker != "w1" || ld.count() != 0 {
		t.Fatalf("first on %v (%v, %d loads), want w1 without a load", l1, err, ld.count())
	}
	// w1 is full: the next one loads on w0 (first listed), outside the
	// lock: Admit returns only once the gated load is done.
	got := make(chan *Lease)
	go func() {
		l, err := s.Admit(ctx, Request{Model: "sql"})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// While the load runs the worker counts as a holder: a third request
	// must not start a load on w2 (max_replicas 2), and waits.
	bound := time.After(10 * time.Second)
	for {
		// Changed first, then the check: a change between a check and
		// the wait would otherwise be missed (the load may start before
		// this loop does).
		changed := s.Changed()
		if ws := s.Workers(); len(ws[0].Adapters) == 1 && ws[0].Adapters[0].State == "loading" {
			break
		}
		select {
		case <-changed:
		case <-bound:
			t.Fatal("no load started on a second worker within 10s")
		}
	}
	tk := s.Submit(Request{Model: "sql"}, nil)
	if tk.Done() {
		l3, _ := tk.Result()
		t.Fatalf("third request bound to %s while both holders are busy; want it to wait", l3.Worker)
	}
	close(ld.gate)
	l2 := <-got
	if l2.Worker != "w0" || ld.count() != 1 {
		t.Fatalf("second on %s with %d loads, want w0 after one load", l2.Worker, ld.count())
	}
	if a := l2.Decision.Adapter; a == nil || a.State != "loading on demand" {
		t.Errorf("record's adapter = %+v, want loading on demand", a)
	}
	l1.Release()
	<-tk.Wait()
	if l3, err := tk.Result(); err != nil || l3.Worker != "w1" {
		t.Fatalf("third on %v (%v), want w1", l3, err)
	}
	if ld.count() != 1 {
		t.Errorf("%d loads (%v), want 1", ld.count(), ld.loads)
	}
}

// A failed load sends the request to another worker; when every load
// fails the request is refused with ErrAdapterLoad naming the error.
func TestAdapterFilter_LoadFailureRetriesElsewhere(t *testing.T) {
	tests := []struct {
		name    string
		fail    map[string]bool
		worker  string
		wantErr bool
	}{
		{name: "first fails", fail: map[string]bool{"w0": true}, worker: "w1"},
		{name: "all fail", fail: map[string]bool{"w0": true, "w1": true, "w2": true}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ld := &loader{fail: tt.fail}
			s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base"}},
				LoadOnDemand: true, MaxReplicas: 3, Loader: ld}}, loraFleet("", true)...)
			l, err := s.Admit(context.Background(), Request{Model: "sql"})
			if tt.wantErr {
				if !errors.Is(err, ErrAdapterLoad) || !strings.Contains(err.Error(), "no adapter found") {
					t.Fatalf("err = %v, want ErrAdapterLoad with the worker's answer", err)
				}
				var ref *Refusal
				if !errors.As(err, &ref) || ref.Reason != "adapter_load_failed" {
					t.Fatalf("err = %#v, want a Refusal adapter_load_failed", err)
				}
				return
			}
			if err != nil || l.Worker != tt.worker {
				t.Fatalf("on %v (%v), want %s", l, err, tt.worker)
			}
			for _, ws := range s.Workers() {
				if held := len(ws.Adapters) > 0; held != (ws.Name == tt.worker) {
					t.Errorf("%s holds %v", ws.Name, ws.Adapters)
				}
			}
		})
	}
}

// A worker that cannot load adapters is never chosen to load one.
func TestAdapterFilter_NotLoadable(t *testing.T) {
	ld := &loader{}
	s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base"}},
		LoadOnDemand: true, Loader: ld}}, loraFleet("", false)...)
	_, err := s.Admit(context.Background(), Request{Model: "sql"})
	if !errors.Is(err, ErrUnknownModel) || ld.count() != 0 {
		t.Fatalf("err %v with %d loads; want ErrUnknownModel at once and no load", err, ld.count())
	}
}

// A worker whose model list was never read may hold the adapter: no
// load starts until it reports, or the adapter could end up on more
// than max_replicas cards once the report says that worker had it.
func TestAdapterFilter_NoLoadWhileAWorkersAdaptersAreUnknown(t *testing.T) {
	ld := &loader{gate: make(chan struct{})}
	close(ld.gate)
	ws := loraFleet("", true)
	unread := newSource(snapshot.Snapshot{Health: snapshot.HealthOK}) // Models nil: never scraped
	ws[2].Source = unread
	s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base", Path: "/a/sql"}},
		LoadOnDemand: true, MaxReplicas: 1, Loader: ld}}, ws...)
	tk := s.Submit(Request{Model: "sql"}, nil)
	if tk.Done() {
		l, err := tk.Result()
		t.Fatalf("bound to %v (%v) with %d loads while w2's adapters are unknown; want it to wait", l, err, ld.count())
	}
	// w2's first scrape: it holds sql. The request goes there, no load.
	unread.Set(snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"base", "sql"}, Adapters: []lora.Info{{Name: "sql", Base: "base"}}})
	s.Kick()
	<-tk.Wait()
	l, err := tk.Result()
	if err != nil || l.Worker != "w2" {
		t.Fatalf("after w2 reported, on %v (%v), want w2, which holds it", l, err)
	}
	if err := l.Ready(context.Background()); err != nil || ld.count() != 0 {
		t.Errorf("Ready: %v, %d loads; want none", err, ld.count())
	}
	l.Release()
}
