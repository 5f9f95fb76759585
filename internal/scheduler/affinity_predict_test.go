package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/stats"
)

// affinitySched returns a scheduler over n workers of 4 slots each (w0,
// w1, ...), with a prefix index, the session hint and cfg's rule
// settings, its predictor trained through Lease.Complete on train
// requests per worker, one at a time: TTFT is 20 ms plus the prompt at
// 5,000 tokens/s, decode 40 tok/s. train 0 leaves every prediction
// unknown.
func affinitySched(t *testing.T, cfg Config, n, train int) *Scheduler {
	t.Helper()
	clk := NewManualClock(time.Unix(10000, 0))
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxQueue, cfg.Clock, cfg.Stats, cfg.Predictor = 8, clk, tr, predict.New(tr)
	cfg.PrefixIndex, cfg.SessionAffinity = prefix.NewIndex(prefix.Options{}), true
	ws := workers(n, 4, "m")
	s := newSched(t, cfg, ws...)
	for i := range train * n {
		want := ws[i%n].Name
		prompt := 100 + (i*397)%3900
		l := admitNow(t, s, Request{Model: "m", PromptTokens: prompt, Exclude: allBut(ws, want)})
		ttft := 20*time.Millisecond + time.Duration(float64(prompt)/5000*float64(time.Second))
		clk.Advance(ttft + time.Second)
		l.Complete(stats.Observation{TTFT: ttft, E2E: ttft + time.Second, OutputTokens: 41, DecodeTPS: 40}, tr, clk.Now())
	}
	return s
}

// allBut names every worker of ws but keep.
func allBut(ws []WorkerSpec, keep string) []string {
	var out []string
	for _, w := range ws {
		if w.Name != keep {
			out = append(out, w.Name)
		}
	}
	return out
}

// load puts running[i] requests in flight on worker i, and returns them.
func load(t *testing.T, s *Scheduler, running ...int) []*Lease {
	t.Helper()
	ws := make([]WorkerSpec, len(running))
	for i := range ws {
		ws[i].Name = fmt.Sprintf("w%d", i)
	}
	var out []*Lease
	for i, n := range running {
		for range n {
			out = append(out, admitNow(t, s, Request{Model: "m", PromptTokens: 50, Exclude: allBut(ws, ws[i].Name)}))
		}
	}
	return out
}

// sessionOn serves a session's request of prompt tokens on worker, so
// the session hint expects worker to hold it.
func sessionOn(t *testing.T, s *Scheduler, n int, worker string, prompt int) {
	t.Helper()
	ws := workers(n, 4, "m")
	admitNow(t, s, Request{Model: "m", PromptTokens: prompt, Session: "s1", SessionSource: "header x-session-id", Exclude: allBut(ws, worker)}).Release()
}

// A conversation's next turn goes back to the worker holding it, though
// that worker runs one request more than the others and the score sends
// it elsewhere, when its first token there is predicted far sooner and
// the streams there lose less than the prefill it saves; with the rule
// off, or before the predictor knows the workers, the score decides.
func TestPredictedAffinity_HolderWinsWhenPredictedCheaper(t *testing.T) {
	for _, tt := range []struct {
		name  string
		on    bool
		train int
		want  string
	}{
		{"rule on", true, 12, "w1"},
		{"rule off", false, 12, "w0"},
		{"nothing learnt yet", true, 0, "w0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := affinitySched(t, Config{PredictedAffinity: tt.on}, 3, tt.train)
			sessionOn(t, s, 3, "w1", 3600)
			running := load(t, s, 1, 2, 1)
			defer func() {
				for _, l := range running {
					l.Release()
				}
			}()
			l := admitNow(t, s, Request{Model: "m", PromptTokens: 4000, Session: "s1", SessionSource: "header x-session-id"})
			defer l.Release()
			r := l.Decision.Explain()
			if l.Worker != tt.want {
				t.Fatalf("next turn on %s, want %s; reason: %s", l.Worker, tt.want, r.Reason)
			}
			ranked := slices.Clone(r.Candidates)
			slices.SortFunc(ranked, func(a, b decisions.Candidate) int { return a.Rank - b.Rank })
			if ranked[0].Worker != l.Worker {
				t.Errorf("rank 1 is %s, chosen %s", ranked[0].Worker, l.Worker)
			}
			overrode := strings.HasPrefix(r.Reason, "prefix affinity by prediction: w1 holds 90% of the prompt (session hint) against 0% on w0")
			if overrode != (tt.want == "w1") {
				t.Errorf("reason %q", r.Reason)
			}
		})
	}
}

// The rule never makes a worker run two or more, over 1.5× the mean,
// while another runs nothing: the holder of a conversation running one
// request loses to an idle worker, as under the score, unless the bound
// is lifted (AffinityHerd below 0, for measuring what it costs).
func TestPredictedAffinity_NoHerdingOntoABusyCardWhileAnotherIdles(t *testing.T) {
	for _, tt := range []struct {
		herd float64
		want string
	}{{0, "w0"}, {-1, "w1"}} {
		t.Run(fmt.Sprint(tt.herd), func(t *testing.T) {
			s := affinitySched(t, Config{PredictedAffinity: true, AffinityHerd: tt.herd}, 2, 12)
			sessionOn(t, s, 2, "w1", 3600)
			running := load(t, s, 0, 1)
			defer running[0].Release()
			l := admitNow(t, s, Request{Model: "m", PromptTokens: 4000, Session: "s1"})
			defer l.Release()
			if l.Worker != tt.want {
				t.Fatalf("herd bound %v: next turn on %s, want %s; reason: %s", tt.herd, l.Worker, tt.want, l.Decision.Explain().Reason)
			}
		})
	}
}

// A holder that holds little of a long prompt and runs more streams is
// predicted to cost more, for the request's first token and for the
// streams its prefill stalls: the score's choice stands.
func TestPredictedAffinity_ScoreStandsWhenTheHolderCostsMore(t *testing.T) {
	s := affinitySched(t, Config{PredictedAffinity: true}, 3, 12)
	sessionOn(t, s, 3, "w1", 800)
	running := load(t, s, 1, 3, 1)
	defer func() {
		for _, l := range running {
			l.Release()
		}
	}()
	l := admitNow(t, s, Request{Model: "m", PromptTokens: 4000, Session: "s1"})
	defer l.Release()
	if r := l.Decision.Explain(); l.Worker == "w1" || strings.HasPrefix(r.Reason, "prefix affinity") {
		t.Fatalf("on %s (%s); want the score's choice, w1 holding a fifth of the prompt behind three streams", l.Worker, r.Reason)
	}
}
