package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/decisions"
)

// A record lists the workers configured when it was made, read after the
// fleet changed.
func TestRecord_ListsTheFleetOfItsDecision(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 5}, workers(3, 4, "m")...)
	names := func(l *Lease) []string {
		var out []string
		for _, c := range l.Decision.Explain().Candidates {
			out = append(out, c.Worker)
		}
		return out
	}
	admit := func() *Lease {
		l, err := s.Admit(context.Background(), Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	before := admit()
	if err := s.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddWorker(WorkerSpec{Name: "x", Models: []string{"m"}, MaxConcurrency: 4}); err != nil {
		t.Fatal(err)
	}
	after := admit()
	if got, want := strings.Join(names(before), ","), "w0,w1,w2"; got != want {
		t.Errorf("record made before the change lists %s, want %s", got, want)
	}
	if got, want := strings.Join(names(after), ","), "w0,w2,x"; got != want {
		t.Errorf("record made after the change lists %s, want %s", got, want)
	}
}

// A refusal's record ranks the workers that could have taken the request
// as a bound request's would, the score computed when the record is read
// rather than under the lock.
func TestRecord_RefusalRanksWhoCouldHaveGone(t *testing.T) {
	var recs []*decisions.Record
	cfg := Config{MaxQueue: 5, Recorder: func(r *decisions.Record) { recs = append(recs, r) }}
	s := newSched(t, cfg, workers(3, 4, "m")...)
	busy, err := s.Admit(context.Background(), Request{Model: "m"}) // w0 has one in flight
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	if _, err := s.Admit(context.Background(), Request{Model: "m", Class: "nope"}); !errors.Is(err, ErrUnknownClass) {
		t.Fatalf("unknown class: %v", err)
	}
	rec := recs[len(recs)-1]
	if rec.Chosen != "" || rec.Outcome != "unknown_priority_class" {
		t.Fatalf("refusal record chose %q with outcome %q", rec.Chosen, rec.Outcome)
	}
	got := map[string]int{}
	for _, c := range rec.Explain().Candidates {
		got[c.Worker] = c.Rank
		if len(c.Terms) == 0 || c.Total == 0 && c.Worker == "w0" {
			t.Errorf("%s: terms %v, total %v: not scored", c.Worker, c.Terms, c.Total)
		}
	}
	if diff := cmp.Diff(map[string]int{"w1": 1, "w2": 2, "w0": 3}, got); diff != "" {
		t.Errorf("ranks (-want +got):\n%s", diff)
	}
}

// A worker's state shows its part in the latest decision that scored it:
// a worker full at the later picks shows the earlier one, and one scored
// again shows the new one.
func TestWorkers_LastTermsAreOfTheLatestDecisionScoringEach(t *testing.T) {
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	s := newSched(t, Config{MaxQueue: 5, Clock: clk}, workers(3, 1, "m")...)
	check := func(want map[string]time.Time) {
		t.Helper()
		for _, ws := range s.Workers() {
			at, ok := want[ws.Name]
			switch {
			case ws.LastTerms == nil:
				t.Fatalf("%s: no last terms, want those of %v", ws.Name, at)
			case !ok || !ws.LastScoredAt.Equal(at) || ws.LastTerms.Worker != ws.Name || !ws.LastTerms.Eligible:
				t.Fatalf("%s: last scored at %v as %+v, want at %v as itself", ws.Name, ws.LastScoredAt, ws.LastTerms, at)
			}
		}
	}
	var held []*Lease
	times := map[string]time.Time{}
	for range 3 { // each pick scores the workers still free, one fewer each time
		clk.Advance(time.Second)
		l := admitNow(t, s, Request{Model: "m"})
		times[l.Worker] = clk.Now()
		held = append(held, l)
	}
	check(times)
	for _, l := range held {
		l.Release()
	}
	clk.Advance(time.Second)
	defer admitNow(t, s, Request{Model: "m"}).Release() // scores all three
	check(map[string]time.Time{"w0": clk.Now(), "w1": clk.Now(), "w2": clk.Now()})
}

// A record read after later picks explains its own decision: what it
// keeps is its own, not the scratch later picks reuse.
func TestRecord_ReadAfterLaterPicksIsItsOwn(t *testing.T) {
	run := func(later int) []decisions.Candidate {
		s := newSched(t, Config{MaxQueue: 5}, workers(16, 4, "m")...)
		var held []*Lease
		for range 5 { // some workers busy, so the scores differ
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		rec := held[len(held)-1].Decision
		for range later {
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 7000})
			if err != nil {
				t.Fatal(err)
			}
			if len(held) < 30 {
				held = append(held, l)
			} else {
				l.Release()
			}
		}
		return rec.Explain().Candidates
	}
	now, later := run(0), run(40)
	if len(now) != 16 {
		t.Fatalf("record lists %d workers, want 16", len(now))
	}
	if d := cmp.Diff(now, later); d != "" {
		t.Errorf("record read after later picks differs (-read at once +read later):\n%s", d)
	}
}
