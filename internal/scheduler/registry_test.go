package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/stats"
)

// activeOf returns the in-flight count Workers shows for name, or -1 when
// the worker is not listed.
func activeOf(s *Scheduler, name string) int {
	for _, w := range s.Workers() {
		if w.Name == name {
			return w.Active
		}
	}
	return -1
}

// A worker removed and added again under the same name (DELETE and POST
// /api/workers, an EndpointSlice that flaps) is still running the streams
// it took before: the new entry counts them, so max_concurrency holds, and
// their releases give back the new entry's slots.
func TestRemoveWorker_ReAddUnderSameNameCountsStreamsStillRunning(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 5}, workers(1, 2, "m")...)
	var old []*Lease
	for range 2 {
		l, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, l)
	}
	if err := s.RemoveWorker("w0"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddWorker(WorkerSpec{Name: "w0", Models: []string{"m"}, MaxConcurrency: 2}); err != nil {
		t.Fatal(err)
	}
	if got, want := activeOf(s, "w0"), 2; got != want {
		t.Fatalf("re-added w0 shows %d in flight, want the %d streams still running", got, want)
	}
	next := s.Submit(Request{Model: "m"}, nil)
	if next.Done() {
		_, err := next.Result()
		t.Fatalf("a new request did not wait (refusal: %v) while w0's 2 old streams fill its max_concurrency 2", err)
	}
	old[0].Release()
	l, err := next.Result()
	if err != nil || l.Worker != "w0" {
		t.Fatalf("after an old stream ended: %v, %v; want bound to w0", l, err)
	}
	if got, want := activeOf(s, "w0"), 2; got != want {
		t.Fatalf("w0 shows %d in flight, want %d (one old stream, one new)", got, want)
	}
	old[1].Release()
	l.Release()
	if got, want := activeOf(s, "w0"), 0; got != want {
		t.Fatalf("w0 shows %d in flight once every stream ended, want %d", got, want)
	}
}

// Workers come and go under new names (Kubernetes names them after pods,
// so every rollout brings new ones): what the stats tracker and the
// predictor hold returns to the workers in the fleet once the streams of
// the removed ones have ended, whether a worker was removed idle or with
// a stream still running.
func TestRemoveWorker_ForgetsTheStateOfWorkersGone(t *testing.T) {
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := predict.New(tr)
	s := newSched(t, Config{MaxQueue: 5, Stats: tr, Predictor: p},
		WorkerSpec{Name: "stays", Models: []string{"k"}, MaxConcurrency: 1})
	done := stats.Observation{TTFT: 80 * time.Millisecond, E2E: time.Second, OutputTokens: 30, DecodeTPS: 40}
	complete := func(model string) *Lease {
		t.Helper()
		l, err := s.Admit(context.Background(), Request{Model: model, PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	complete("k").Complete(done, tr, time.Now())
	for i := range 40 {
		name := fmt.Sprintf("pod-%d", i)
		if err := s.AddWorker(WorkerSpec{Name: name, Models: []string{"m"}, MaxConcurrency: 1}); err != nil {
			t.Fatal(err)
		}
		l := complete("m")
		if i%2 == 0 {
			l.Complete(done, tr, time.Now())
			if err := s.RemoveWorker(name); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// Removed with its stream running: the stream still reports
		// what it achieved when it ends.
		if err := s.RemoveWorker(name); err != nil {
			t.Fatal(err)
		}
		l.Complete(done, tr, time.Now())
	}
	var held []string
	for name := range tr.All() {
		held = append(held, name)
	}
	slices.Sort(held)
	if diff := cmp.Diff([]string{"stays"}, held); diff != "" {
		t.Fatalf("the tracker holds the stats of workers gone (-want +got):\n%s", diff)
	}
	if got, want := p.Len(), 1; got != want {
		t.Fatalf("the predictor holds %d workers' models, want %d (the one in the fleet)", got, want)
	}
}

// A lease released before its answer is reported, on a worker removed
// meanwhile, does not bring back the state forgotten with the worker.
func TestRemoveWorker_LateReportOfAForgottenWorkerIsDropped(t *testing.T) {
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := predict.New(tr)
	s := newSched(t, Config{MaxQueue: 5, Stats: tr, Predictor: p}, workers(1, 1, "m")...)
	l, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveWorker("w0"); err != nil {
		t.Fatal(err)
	}
	l.Release()
	l.Complete(stats.Observation{TTFT: time.Second, E2E: 2 * time.Second, OutputTokens: 9, DecodeTPS: 9}, tr, time.Now())
	if got := tr.All(); len(got) != 0 {
		t.Fatalf("the tracker holds %v after a late report of a forgotten worker", got)
	}
	if got, want := p.Len(), 0; got != want {
		t.Fatalf("the predictor holds %d models, want %d", got, want)
	}
}
