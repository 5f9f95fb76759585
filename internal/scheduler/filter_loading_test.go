package scheduler

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// A worker loading one of its models keeps serving the others, and takes
// the one it loads once the load is done; until then a request for it
// goes to another worker, or waits for one, and the record says why.
func TestLoadingFilter_KeepsOutOnlyTheModelLoading(t *testing.T) {
	src := newSource(snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"a", "b"}, LoadingModels: []string{"b"}})
	s := newSched(t, Config{MaxQueue: 4},
		WorkerSpec{Name: "multi", Models: []string{"a", "b"}, MaxConcurrency: 4, Source: src},
		WorkerSpec{Name: "other", Models: []string{"b"}, MaxConcurrency: 1})
	ctx := context.Background()

	la, err := s.Admit(ctx, Request{Model: "a"})
	if err != nil || la.Worker != "multi" {
		t.Fatalf("model a on %v (%v), want multi: it is loaded there", la, err)
	}
	lb, err := s.Admit(ctx, Request{Model: "b"})
	if err != nil || lb.Worker != "other" {
		t.Fatalf("model b on %v (%v), want other: multi is still loading it", lb, err)
	}
	var why string
	for _, c := range lb.Decision.Explain().Candidates {
		if c.Worker == "multi" {
			why = c.Why
		}
	}
	if !strings.Contains(why, `loading model "b"`) {
		t.Errorf("record says of multi %q, want it loading model \"b\"", why)
	}

	// other is full: the next request for b waits, and is bound to multi
	// as soon as multi says the load is done.
	tk := s.Submit(Request{Model: "b"}, nil)
	if tk.Done() {
		t.Fatal("request for b bound while its only free worker still loads it")
	}
	src.Set(snapshot.Snapshot{Health: snapshot.HealthOK, Models: []string{"a", "b"}})
	s.Kick()
	<-tk.Wait()
	if l, err := tk.Result(); err != nil || l.Worker != "multi" {
		t.Fatalf("after the load, request for b on %v (%v), want multi", l, err)
	}
}
