package scheduler

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// A load whose lease is released before Ready (bound in the instant its
// client left) is forgotten: the worker stops showing the adapter as
// loading, and the next request for it makes a load itself rather than
// wait for one nobody makes.
func TestAdapterLoad_ReleasedBeforeReadyIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ld := &loader{}
		s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base"}},
			LoadOnDemand: true, MaxReplicas: 1, Loader: ld}}, loraFleet("", true)...)
		tk := s.Submit(Request{Model: "sql"}, nil)
		first, err := tk.Result()
		if !tk.Done() || err != nil || first.Decision.Adapter == nil || first.Decision.Adapter.State != "loading on demand" {
			t.Fatalf("first request: %v (%v), want bound to load the adapter", first, err)
		}
		first.Release() // without Ready, as Admit does when its client left
		for _, ws := range s.Workers() {
			if len(ws.Adapters) > 0 {
				t.Errorf("after the release %s shows %+v, want no adapter", ws.Name, ws.Adapters)
			}
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := make(chan *Lease, 1)
		go func() {
			l, err := s.Admit(ctx, Request{Model: "sql"})
			if err != nil {
				t.Errorf("second request: %v", err)
			}
			got <- l
		}()
		synctest.Wait() // the second request is served or blocked for good
		var second *Lease
		select {
		case second = <-got:
		default:
			cancel()
			<-got
			t.Fatalf("the second request waits for a load nobody makes (%d loads made)", ld.count())
		}
		defer second.Release()
		if got, want := ld.count(), 1; got != want {
			t.Errorf("%d loads made (%v), want %d", got, ld.loads, want)
		}
		for _, ws := range s.Workers() {
			for _, a := range ws.Adapters {
				if ws.Name != second.Worker || a.State != "loaded" {
					t.Errorf("%s shows %+v; want only %s, loaded", ws.Name, a, second.Worker)
				}
			}
		}
	})
}

// A load bound to two leases is made by the one that gets ready when the
// one that set it off is released before Ready.
func TestAdapterLoad_ReleasedBeforeReadyPassesToTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ld := &loader{}
		s := newSched(t, Config{MaxQueue: 4, Adapters: lora.Config{Adapters: []lora.Spec{{Name: "sql", Base: "base"}},
			LoadOnDemand: true, MaxReplicas: 1, Loader: ld}},
			WorkerSpec{Name: "w0", Models: []string{"base"}, MaxConcurrency: 2, LoadsAdapters: true,
				Source: newSource(snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"base"}})})
		var leases [2]*Lease
		for i := range leases {
			tk := s.Submit(Request{Model: "sql"}, nil)
			l, err := tk.Result()
			if !tk.Done() || err != nil {
				t.Fatalf("request %d: %v (%v), want bound", i, l, err)
			}
			leases[i] = l
		}
		if got, want := leases[1].Decision.Adapter.State, "loading on demand (by an earlier request)"; got != want {
			t.Fatalf("second request's adapter state %q, want %q", got, want)
		}
		leases[0].Release() // without Ready, as Admit does when its client left

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ready := make(chan error, 1)
		go func() { ready <- leases[1].Ready(ctx) }()
		synctest.Wait()
		select {
		case err := <-ready:
			if err != nil {
				t.Fatalf("Ready: %v", err)
			}
		default:
			cancel()
			<-ready
			t.Fatalf("the second request waits for a load nobody makes (%d loads made)", ld.count())
		}
		defer leases[1].Release()
		if got, want := ld.count(), 1; got != want {
			t.Errorf("%d loads made (%v), want %d", got, ld.loads, want)
		}
		if a := s.Workers()[0].Adapters; len(a) != 1 || a[0].State != "loaded" {
			t.Errorf("w0 shows %+v, want sql loaded", a)
		}
	})
}
