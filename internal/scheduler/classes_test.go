package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/outlen"
	"github.com/sluice-router/sluice/internal/stats"
)

func TestScheduler_PriorityClassesWithAgingBound(t *testing.T) {
	tests := []struct {
		name string
		// arrivals in order: name, class, seconds after the first
		arrivals []struct {
			name, class string
			at          int
		}
		want []string
	}{
		{
			name: "interactive overtakes batch",
			arrivals: []struct {
				name, class string
				at          int
			}{{"b1", "batch", 0}, {"b2", "batch", 1}, {"i1", "interactive", 2}, {"i2", "", 3}},
			want: []string{"i1", "i2", "b1", "b2"},
		},
		{
			name: "batch waiting past max_overtake is not overtaken",
			arrivals: []struct {
				name, class string
				at          int
			}{{"b1", "batch", 0}, {"i1", "interactive", 5}, {"i2", "interactive", 11}, {"b2", "batch", 12}},
			// i1 came 5 s after b1 and may pass it; i2 came 11 s after
			// b1 and may not. b2 then yields to i2, 1 s older than it.
			want: []string{"i1", "b1", "i2", "b2"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			clock := &fakeClock{t: start}
			s := newSched(t, Config{MaxQueue: 10, Clock: clock, MaxOvertake: 10 * time.Second}, workers(1, 1, "m")...)
			held, _ := s.Submit(Request{Model: "m"}, nil).Result()
			var log bindLog
			var tickets []*Ticket
			for _, a := range tt.arrivals {
				clock.t = start.Add(time.Duration(a.at) * time.Second)
				tickets = append(tickets, s.Submit(Request{Model: "m", Class: a.class}, log.notify(a.name)))
			}
			clock.t = start.Add(time.Minute)
			serveAll(t, held, tickets)
			if diff := cmp.Diff(tt.want, log.names); diff != "" {
				t.Fatalf("bind order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestScheduler_RecordsClassTenantAndEstimate(t *testing.T) {
	var mu sync.Mutex
	var recs []*decisions.Record
	s := newSched(t, Config{MaxQueue: 5, DefaultOutputTokens: 200, Recorder: func(r *decisions.Record) {
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	}}, workers(1, 4, "m")...)
	l, err := s.Submit(Request{Model: "m", Tenant: "acme", Class: "batch", PromptTokens: 50}, nil).Result()
	if err != nil {
		t.Fatal(err)
	}
	l.Complete(stats.Observation{OutputTokens: 80}, nil, time.Time{})
	l2, _ := s.Submit(Request{Model: "m", PromptTokens: 50}, nil).Result()
	l2.Release()
	l3, _ := s.Submit(Request{Model: "m", PromptTokens: 50, MaxTokens: 10}, nil).Result()
	l3.Release()
	_, err = s.Submit(Request{Model: "m", Class: "urgent"}, nil).Result()
	if !errors.Is(err, ErrUnknownClass) {
		t.Fatalf("err %v, want unknown class", err)
	}
	type view struct {
		Class, Tenant, Source, Outcome string
		Expected                       int
	}
	var got []view
	for _, r := range recs {
		got = append(got, view{r.Class, r.Tenant, r.EstimateSource, r.Outcome, r.ExpectedOutputTokens})
	}
	want := []view{
		{"batch", "acme", outlen.FromDefault, "bound", 200},
		{"interactive", "", outlen.FromModel, "bound", 80},
		{"interactive", "", outlen.FromMaxTokens, "bound", 10},
		{"urgent", "", outlen.FromModel, "unknown_priority_class", 80},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
}

func TestScheduler_QueueDepthsByClass(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, append(workers(1, 1, "m"), WorkerSpec{Name: "x", Models: []string{"idle"}, MaxConcurrency: 4})...)
	s.Submit(Request{Model: "m"}, nil)
	s.Submit(Request{Model: "m"}, nil)
	s.Submit(Request{Model: "m", Class: "batch"}, nil)
	s.Submit(Request{Model: "m", Class: "batch", Tenant: "x"}, nil)
	s.Submit(Request{Model: "m", Class: "batch", Attempt: 2, Exclude: []string{"nobody"}}, nil)
	s.Submit(Request{Model: "idle"}, nil) // bound: nothing waits for it
	// A served model is listed with zeros, so its gauges stay put.
	want := map[string]map[string]int{"m": {"interactive": 1, "batch": 3}, "idle": {"interactive": 0, "batch": 0}}
	if diff := cmp.Diff(want, s.QueueDepthsByClass()); diff != "" {
		t.Fatalf("depths (-want +got):\n%s", diff)
	}
	if got := s.QueueDepth("m"); got != 4 {
		t.Fatalf("depth %d, want 4", got)
	}
}

func TestNew_RejectsBadClasses(t *testing.T) {
	for _, cs := range [][]Class{
		{{Name: ""}},
		{{Name: "a"}, {Name: "a"}},
		{{Name: "a", MaxQueueWait: -time.Second}},
	} {
		if _, err := New(Config{Classes: cs}); err == nil {
			t.Errorf("classes %+v accepted", cs)
		}
	}
}

func TestScheduler_RequestedClassNeverRaisesPriority(t *testing.T) {
	s := newSched(t, Config{}, workers(1, 1, "m")...)
	tests := []struct{ granted, asked, want string }{
		{"", "", ""},
		{"", "batch", "batch"},
		{"batch", "interactive", "batch"},
		{"batch", "", "batch"},
		{"interactive", "batch", "batch"},
		{"batch", "urgent", "urgent"}, // refused by admission as unknown
	}
	for _, tt := range tests {
		if got := s.RequestedClass(tt.granted, tt.asked); got != tt.want {
			t.Errorf("RequestedClass(%q, %q) = %q, want %q", tt.granted, tt.asked, got, tt.want)
		}
	}
}

// Admit waits no longer than the request's class deadline.
func TestScheduler_AdmitTimesOutAtClassDeadline(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(1000, 0))
	classes := []Class{{Name: "interactive", MaxQueueWait: 5 * time.Second}, {Name: "batch", Priority: 1}}
	s := newSched(t, Config{MaxQueue: 5, QueueTimeout: time.Minute, Clock: clk, Classes: classes}, workers(1, 1, "m")...)
	held, err := s.Admit(context.Background(), Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Admit(context.Background(), Request{Model: "m"})
		errc <- err
	}()
	clk.AwaitTimers(1)
	clk.Advance(5 * time.Second)
	if err := <-errc; !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("err %v, want queue timeout at the class's 5 s", err)
	}
}
