package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/clock/clocktest"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/stats"
)

// cards are two workers of unequal prefill speed, tokens per second:
// "slowcard" listed first, so that the score alone prefers it when both
// are equally busy.
var cards = map[string]float64{"slowcard": 1000, "fastcard": 10000}

// promiseSched returns a scheduler admitting by promise (or by the
// learned limits) over the two cards, its predictor trained through
// Lease.Complete on 24 requests each, one at a time, of prompts of 100 to
// 4,000 tokens: TTFT is 20 ms plus the prompt at the card's prefill
// speed, decode 40 tok/s.
func promiseSched(t *testing.T, mode string, slo predict.SLO) (*Scheduler, *clocktest.ManualClock) {
	t.Helper()
	clk := clocktest.NewManualClock(time.Unix(10000, 0))
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, Config{MaxQueue: 8, Clock: clk, Stats: tr, Predictor: predict.New(tr), Admission: mode,
		DefaultSLO: slo, Limits: limit.Config{Fixed: true}},
		WorkerSpec{Name: "slowcard", Models: []string{"m"}, MaxConcurrency: 4},
		WorkerSpec{Name: "fastcard", Models: []string{"m"}, MaxConcurrency: 4})
	for i := range 48 {
		prompt := 100 + (i*397)%3900
		want := []string{"slowcard", "fastcard"}[i%2]
		// Each its own generous SLO, so that training is served whatever
		// the test's default.
		easy := predict.SLO{TTFT: time.Hour, OnMiss: predict.OnMissServe}
		l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: prompt, Exclude: []string{other(want)}, SLO: easy})
		if err != nil || l.Worker != want {
			t.Fatalf("training request %d on %v (%v), want %s", i, l, err, want)
		}
		ttft := 20*time.Millisecond + time.Duration(float64(prompt)/cards[want]*float64(time.Second))
		clk.Advance(ttft + time.Second)
		l.Complete(stats.Observation{TTFT: ttft, E2E: ttft + time.Second, OutputTokens: 41, DecodeTPS: 40}, tr, clk.Now())
	}
	return s, clk
}

func other(w string) string {
	if w == "slowcard" {
		return "fastcard"
	}
	return "slowcard"
}

// A long prompt goes to the card predicted to give its first token in
// time, though the score prefers the other (idle, listed first); judged
// by the limits it goes where the score says.
func TestPromise_LongPromptGoesWhereItMeetsItsObjective(t *testing.T) {
	slo := predict.SLO{TTFT: time.Second, MinDecode: 10, OnMiss: predict.OnMissServe}
	for _, tt := range []struct{ mode, want string }{{AdmitBySLO, "fastcard"}, {AdmitByLimits, "slowcard"}} {
		t.Run(tt.mode, func(t *testing.T) {
			s, _ := promiseSched(t, tt.mode, slo)
			busy, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 50, Exclude: []string{"slowcard"}})
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Release()
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 3000})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			if l.Worker != tt.want {
				t.Fatalf("3,000-token prompt on %s, want %s; record: %s %+v", l.Worker, tt.want, l.Decision.Reason, l.Decision.Promise)
			}
			p := l.Decision.Promise
			if p == nil || l.Prediction == nil || !p.Known || p.PredictedTTFTMs <= 0 {
				t.Fatalf("record's promise %+v, lease prediction %v: want a known prediction", p, l.Prediction)
			}
			if tt.mode == AdmitBySLO && (p.Verdict != "meets" || p.ObjectiveMs != 1000) {
				t.Errorf("verdict %q, objective %v ms; want meets within 1000 ms", p.Verdict, p.ObjectiveMs)
			}
			// The prediction is the card's: 20 ms + 3,000 tokens at 10,000/s.
			if got := p.PredictedTTFTMs; tt.want == "fastcard" && (got < 200 || got > 600) {
				t.Errorf("predicted TTFT %.0f ms on fastcard, want about 320", got)
			}
		})
	}
}

// When no card is predicted to meet the objective, now or after waiting,
// on_miss: refuse refuses at once with its own reason and a Retry-After,
// and on_miss: serve serves where the first token is predicted soonest.
func TestPromise_OnMiss(t *testing.T) {
	for _, onMiss := range []predict.OnMiss{predict.OnMissRefuse, predict.OnMissServe} {
		t.Run(string(onMiss), func(t *testing.T) {
			s, _ := promiseSched(t, AdmitBySLO, predict.SLO{TTFT: 50 * time.Millisecond, MinDecode: 10, OnMiss: onMiss})
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 3000})
			if onMiss == predict.OnMissServe {
				if err != nil || l.Worker != "fastcard" {
					t.Fatalf("served on %v (%v), want fastcard, where the miss is smallest", l, err)
				}
				if v := l.Decision.Promise.Verdict; v == "meets" || v == "" {
					t.Errorf("verdict %q, want it to say nobody meets it", v)
				}
				l.Release()
				return
			}
			var ref *Refusal
			if !errors.As(err, &ref) || !errors.Is(err, ErrSLOUnmeetable) {
				t.Fatalf("admit: %v, %v; want a refusal for an unmeetable SLO", l, err)
			}
			if ref.Reason != "slo_unmeetable" || ref.RetryAfter < time.Second {
				t.Errorf("refusal %q, retry after %v", ref.Reason, ref.RetryAfter)
			}
		})
	}
}

// A request's own SLO (a key's, or a header's) is tightened, never
// loosened, and fills in from its class's then the default.
func TestPromise_RequestSLOTightens(t *testing.T) {
	s, _ := promiseSched(t, AdmitBySLO, predict.SLO{TTFT: 10 * time.Second, MinDecode: 10, OnMiss: predict.OnMissRefuse})
	for _, tt := range []struct {
		maxTTFT time.Duration
		refused bool
	}{{0, false}, {50 * time.Millisecond, true}} {
		t.Run(fmt.Sprint(tt.maxTTFT), func(t *testing.T) {
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 3000, SLO: predict.SLO{MaxTTFT: tt.maxTTFT}})
			if refused := errors.Is(err, ErrSLOUnmeetable); refused != tt.refused {
				t.Fatalf("refused %v (%v), want %v", refused, err, tt.refused)
			}
			if l != nil {
				l.Release()
			}
		})
	}
}
