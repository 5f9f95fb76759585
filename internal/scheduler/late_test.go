package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/predict"
)

// TestScheduler_LateRequestsYield queues requests behind a busy worker
// and frees it at a given time: with admission.yield_late a request past
// its first-token objective (no predictor here: the fallback SLO, 2 s
// plus 250 ms per 1,000 prompt tokens) goes after those that can still
// keep theirs, within the aging bound; the records of the requests that
// went first say why.
func TestScheduler_LateRequestsYield(t *testing.T) {
	type arrival struct {
		name   string
		at     time.Duration
		prompt int
	}
	tests := []struct {
		name      string
		off       bool
		arrivals  []arrival
		serveAt   time.Duration
		want      []string
		explained []string // whose records say they went before a late request
	}{
		{
			name:     "off: arrival order",
			off:      true,
			arrivals: []arrival{{"a", 0, 0}, {"b", 1500 * time.Millisecond, 0}, {"c", 2500 * time.Millisecond, 0}},
			serveAt:  3 * time.Second,
			want:     []string{"a", "b", "c"},
		},
		{
			// At 3 s a has waited past its 2 s; b and c can still
			// make theirs.
			name:      "the late request yields to those on time",
			arrivals:  []arrival{{"a", 0, 0}, {"b", 1500 * time.Millisecond, 0}, {"c", 2500 * time.Millisecond, 0}},
			serveAt:   3 * time.Second,
			want:      []string{"b", "c", "a"},
			explained: []string{"b", "c"},
		},
		{
			// 8,000 prompt tokens allow a 4 s first token: a is on time.
			name:     "a long prompt's allowance counts",
			arrivals: []arrival{{"a", 0, 8000}, {"b", 1500 * time.Millisecond, 0}, {"c", 2500 * time.Millisecond, 0}},
			serveAt:  3 * time.Second,
			want:     []string{"a", "b", "c"},
		},
		{
			// b came 11 s after a: past the aging bound of 10 s.
			name:     "never past the aging bound",
			arrivals: []arrival{{"a", 0, 0}, {"b", 11 * time.Second, 0}},
			serveAt:  12 * time.Second,
			want:     []string{"a", "b"},
		},
		{
			name:     "all late: arrival order",
			arrivals: []arrival{{"a", 0, 0}, {"b", 500 * time.Millisecond, 0}},
			serveAt:  5 * time.Second,
			want:     []string{"a", "b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			clock := &fakeClock{t: start}
			s := newSched(t, Config{MaxQueue: 10, Clock: clock, MaxOvertake: 10 * time.Second, YieldLate: !tt.off}, workers(1, 1, "m")...)
			held, err := s.Submit(Request{Model: "m"}, nil).Result()
			if err != nil {
				t.Fatal(err)
			}
			var log bindLog
			var tickets []*Ticket
			for _, a := range tt.arrivals {
				clock.t = start.Add(a.at)
				tickets = append(tickets, s.Submit(Request{Model: "m", PromptTokens: a.prompt}, log.notify(a.name)))
			}
			clock.t = start.Add(tt.serveAt)
			serveAll(t, held, tickets)
			if diff := cmp.Diff(tt.want, log.names); diff != "" {
				t.Errorf("bind order (-want +got):\n%s", diff)
			}
			var explained []string
			for i, tk := range tickets {
				l, err := tk.Result()
				if err != nil {
					t.Fatalf("%s: %v", tt.arrivals[i].name, err)
				}
				if strings.Contains(l.Decision.Explain().Reason, "already past its first-token objective (admission.yield_late)") {
					explained = append(explained, tt.arrivals[i].name)
				}
			}
			if diff := cmp.Diff(tt.explained, explained); diff != "" {
				t.Errorf("records that say they went before a late request (-want +got):\n%s", diff)
			}
		})
	}
}

// TestScheduler_LateCountsThePrefillOnTheFastestCard: a request is late
// when its wait plus its prompt's prefill on the fastest card of its
// model (as the predictor learned it: fastcard, 10,000 tokens/s) is past
// its objective. A 4,000-token prompt under 2 s + 250 ms per 1,000 has
// 3 s, of which its prefill takes 0.4 s: it is late from 2.6 s of wait.
func TestScheduler_LateCountsThePrefillOnTheFastestCard(t *testing.T) {
	for _, tc := range []struct {
		waited time.Duration
		first  string
	}{
		{2500 * time.Millisecond, "long"},  // 2.5 + 0.4 s: on time
		{2800 * time.Millisecond, "short"}, // 2.8 + 0.4 s: late, though its wait alone is not
	} {
		t.Run(tc.waited.String(), func(t *testing.T) {
			s, clk := promiseSched(t, AdmitByLimits, predict.SLO{TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond, OnMiss: predict.OnMissServe})
			s.cfg.YieldLate = true
			var busy []*Lease
			for range 8 { // both cards full
				l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 10})
				if err != nil {
					t.Fatal(err)
				}
				busy = append(busy, l)
			}
			var log bindLog
			long := s.Submit(Request{Model: "m", PromptTokens: 4000}, log.notify("long"))
			clk.Advance(2 * time.Second)
			short := s.Submit(Request{Model: "m", PromptTokens: 10}, log.notify("short"))
			clk.Advance(tc.waited - 2*time.Second)
			busy[0].Release()
			if long.Done() == short.Done() {
				t.Fatalf("one slot freed: long bound %v, short bound %v, want exactly one", long.Done(), short.Done())
			}
			if diff := cmp.Diff([]string{tc.first}, log.names); diff != "" {
				t.Errorf("bound first (-want +got):\n%s", diff)
			}
		})
	}
}
