package predict

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// trained returns a learner that has seen n requests of traffic on a
// clean (no-collision) card of the given speed, as worker name.
func trained(t testing.TB, l *learner, name string, speed float64, rate float64, n int) {
	t.Helper()
	p := card(speed, 4, 2048, 5)
	p.InterferenceScale = 0
	drive(t, p, trafficSpec{rate: rate, promptMedian: 800, promptSigma: 0.6, n: n, seed: 21},
		func(in Input, _ time.Time) Prediction { return l.p.Predict(name, in) },
		func(pred Prediction, o Outcome, _ int) { l.finish(name, pred, o) })
}

func TestPredictor_UnloadedIsEachCardsOwn(t *testing.T) {
	l := newLearner(t)
	speeds := map[string]float64{"slow": 0.6, "ref": 1, "fast": 2}
	for name, s := range speeds {
		trained(t, l, name, s, 0.25*s, 300)
	}
	var fleet []Unloaded
	for name, s := range speeds {
		u, ok := l.p.Unloaded(name)
		if !ok {
			t.Fatalf("%s: no unloaded figures after 300 requests", name)
		}
		fleet = append(fleet, u)
		// The sim's card: prefill 5,000·speed tokens/s, a solo token every
		// 13.3 ms / speed.
		wantPrefill := time.Duration(float64(200*time.Millisecond) / s)
		if r := float64(u.PrefillPer1k) / float64(wantPrefill); math.Abs(r-1) > 0.1 {
			t.Errorf("%s: prefill %v per 1k, want %v ±10%%", name, u.PrefillPer1k, wantPrefill)
		}
		wantDecode := 1000 / 13.3 * s
		if r := u.SoloDecode / wantDecode; math.Abs(r-1) > 0.1 {
			t.Errorf("%s: solo decode %.1f tok/s, want %.1f ±10%%", name, u.SoloDecode, wantDecode)
		}
		if u.Overhead > 20*time.Millisecond {
			t.Errorf("%s: overhead %v; the sim has none", name, u.Overhead)
		}
	}
	// The slowest card sets the per-1k allowance (2 × 333 ms, over the
	// plain SLO's 250 ms); its half solo rate (about 22.6 tok/s) is over
	// the plain 15 tok/s, which stays.
	d := DefaultSLO(fleet)
	if got, want := float64(d.TTFTPer1k), 2*float64(200*time.Millisecond)/0.6; math.Abs(got/want-1) > 0.1 {
		t.Errorf("default per-1k allowance %v, want about %v", d.TTFTPer1k, time.Duration(want))
	}
	if d.MinDecode != FallbackSLO.MinDecode {
		t.Errorf("default decode floor %.1f, want the plain SLO's %.0f", d.MinDecode, FallbackSLO.MinDecode)
	}
}

func TestPredictor_LoadShowsInThePrediction(t *testing.T) {
	l := newLearner(t)
	trained(t, l, "w", 1, 0.3, 400)
	idle := l.p.Predict("w", Input{PromptTokens: 2000, Slots: 4})
	busy := l.p.Predict("w", Input{PromptTokens: 2000, InFlight: 3, Slots: 4})
	full := l.p.Predict("w", Input{PromptTokens: 2000, InFlight: 5, Slots: 4})
	short := l.p.Predict("w", Input{PromptTokens: 50, InFlight: 3, Slots: 4})
	cached := l.p.Predict("w", Input{PromptTokens: 2000, CachedTokens: 1900, InFlight: 3, Slots: 4})
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"known after 400 requests", idle.Known && busy.Known && full.Known},
		{"busy TTFT longer than idle", busy.TTFT > idle.TTFT},
		{"no wait with a slot free", busy.Wait == 0},
		{"a full worker makes it wait", full.Wait > 0 && full.TTFT > busy.TTFT},
		{"waiting for one stream to end is faster on a full worker", full.TTFTAfterOne < full.TTFT},
		{"a stream frees in a while", full.FreeIn > 0},
		{"a cached prefix is faster", cached.TTFT < busy.TTFT/2},
		{"more streams, slower decode", busy.Decode < idle.Decode},
		{"nobody running, nobody harmed", idle.DecodeOthers == 0},
		{"a long prompt stalls the running streams", busy.DecodeOthers < busy.Decode},
		{"a long prompt stalls them more than a short one", busy.DecodeOthers < short.DecodeOthers},
		{"an end-to-end estimate", busy.E2E > busy.TTFT},
		{"source says fit", busy.Source == SourceFit},
	} {
		if !c.ok {
			t.Errorf("%s: idle %+v busy %+v full %+v short %+v cached %+v", c.name, idle, busy, full, short, cached)
		}
	}
}

func TestPredictor_UnknownWorkerIsNotKnown(t *testing.T) {
	l := newLearner(t)
	got := l.p.Predict("new", Input{PromptTokens: 1000})
	if got.Known || got.Source != SourceNoHistory {
		t.Fatalf("prediction for a worker never seen: %+v", got)
	}
	if _, ok := l.p.Unloaded("new"); ok {
		t.Fatal("unloaded figures for a worker never seen")
	}
}

func TestPredictor_Trusted(t *testing.T) {
	out := Outcome{TTFT: time.Second, DecodeTPS: 50}
	tests := []struct {
		name       string
		n          int
		ttft       time.Duration
		decode     float64
		known      bool
		want       bool
		wantReason string
	}{
		{"no record", 0, 0, 0, true, true, ""},
		{"good predictions", 32, 1100 * time.Millisecond, 52, true, true, ""},
		{"too few misses to judge", 7, 3 * time.Second, 50, true, true, ""},
		{"TTFT misses", 8, 2 * time.Second, 50, true, false, "median TTFT prediction error 100% over the last 8 > 50%"},
		{"decode misses", 20, time.Second, 25, true, false, "median decode prediction error 50% over the last 20 > 30%"},
		{"unknown predictions are not scored", 32, 5 * time.Second, 1, false, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLearner(t)
			for range tt.n {
				l.p.Record("w", Prediction{TTFT: tt.ttft, Decode: tt.decode, Known: tt.known}, out)
			}
			ok, reason := l.p.Trusted("w")
			if ok != tt.want || reason != tt.wantReason {
				t.Fatalf("Trusted = %v, %q; want %v, %q", ok, reason, tt.want, tt.wantReason)
			}
		})
	}
}

func TestPredictor_TrustComesBackWhenPredictionsDo(t *testing.T) {
	l := newLearner(t)
	out := Outcome{TTFT: time.Second, DecodeTPS: 50}
	for range 32 {
		l.p.Record("w", Prediction{TTFT: 3 * time.Second, Decode: 50, Known: true}, out)
	}
	if ok, _ := l.p.Trusted("w"); ok {
		t.Fatal("trusted after 32 misses")
	}
	for range 17 { // a majority of the window
		l.p.Record("w", Prediction{TTFT: time.Second, Decode: 50, Known: true}, out)
	}
	if ok, reason := l.p.Trusted("w"); !ok {
		t.Fatalf("still untrusted after 17 good predictions of 32: %s", reason)
	}
	// Over the run, the 32 misses (an error of 2) outnumber the 17 hits.
	ttft, dec := l.p.RunErrors("w")
	if got := ttft.Median(); ttft.N() != 49 || got < 1.99 || got > 2.02 || dec.Median() > 0.01 { // to within a tally bin
		t.Fatalf("RunErrors: ttft median %v of %d, decode median %v", got, ttft.N(), dec.Median())
	}
}

func TestPredictor_SurvivesARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.db")
	open := func() (*stats.BoltStore, *stats.Tracker) {
		s, err := stats.OpenBolt(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := stats.NewTracker(0.2, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Track(context.Background(), "w"); err != nil {
			t.Fatal(err)
		}
		return s, tr
	}
	s, tr := open()
	l := &learner{tr: tr, p: New(tr)}
	trained(t, l, "w", 1, 0.3, 200)
	for range 10 {
		l.p.Record("w", Prediction{TTFT: 3 * time.Second, Known: true}, Outcome{TTFT: time.Second})
	}
	in := Input{PromptTokens: 1500, CachedTokens: 200, InFlight: 5, Slots: 4, PrefillAhead: 300}
	// Record does not persist by itself; the next outcome does.
	l.finish("w", Prediction{}, Outcome{PromptTokens: 100, TTFT: 30 * time.Millisecond, At: time.Unix(1_900_000_000, 0)})
	before := l.p.Predict("w", in)
	okBefore, reasonBefore := l.p.Trusted("w")
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, tr2 := open()
	defer s2.Close()
	after := New(tr2).Predict("w", in)
	if after != before {
		t.Fatalf("after a restart:\n%+v\nbefore:\n%+v", after, before)
	}
	p2 := New(tr2)
	if ok, reason := p2.Trusted("w"); ok != okBefore || reason != reasonBefore {
		t.Fatalf("trust after a restart %v %q, before %v %q", ok, reason, okBefore, reasonBefore)
	}
}

// A worker that leaves the fleet leaves the predictor; one that comes
// back under its name starts from the fit persisted with its stats.
func TestPredictor_ForgetDropsTheModelNotTheFit(t *testing.T) {
	l := newLearner(t)
	trained(t, l, "w", 1, 0.3, 100)
	in := Input{PromptTokens: 1500, CachedTokens: 200, InFlight: 5, Slots: 4}
	before := l.p.Predict("w", in)
	l.p.Predict("other", in)
	l.p.Forget("w")
	if got, want := l.p.Len(), 1; got != want {
		t.Fatalf("the predictor holds %d models after forgetting w, want %d", got, want)
	}
	if after := l.p.Predict("w", in); after != before {
		t.Fatalf("w back under its name predicts\n%+v\nbefore it left:\n%+v", after, before)
	}
}

func TestPredictor_IgnoresAFitOfAnotherShape(t *testing.T) {
	l := newLearner(t)
	l.tr.SetFit("w", &stats.Fit{Theta: []float64{1, 2}, P: []float64{1}, Samples: 99}, time.Unix(0, 0))
	got := l.p.Predict("w", Input{PromptTokens: 1000})
	if got.Known || !strings.HasPrefix(got.Source, "prior") {
		t.Fatalf("a fit of another shape was used: %+v", got)
	}
}

func TestPredict_AllocatesNothing(t *testing.T) {
	l := newLearner(t)
	trained(t, l, "w", 1, 0.3, 100)
	in := Input{PromptTokens: 1500, CachedTokens: 200, InFlight: 5, Slots: 4, Queue: 1}
	if n := testing.AllocsPerRun(100, func() { l.p.Predict("w", in) }); n != 0 {
		t.Fatalf("Predict allocates %v times", n)
	}
}

func BenchmarkPredict(b *testing.B) {
	l := newLearner(b)
	trained(b, l, "w", 1, 0.3, 300)
	in := Input{PromptTokens: 1500, CachedTokens: 200, InFlight: 5, Slots: 4, Queue: 1}
	b.Run("cached line", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.p.Predict("w", in)
		}
	})
	// Every pick after a finished request refits the decode line.
	b.Run("stats changed", func(b *testing.B) {
		b.ReportAllocs()
		m := l.p.workers["w"]
		for b.Loop() {
			m.lineOf = nil
			l.p.Predict("w", in)
		}
	})
}

func TestPredictor_UnknownSlotsMeanNoWait(t *testing.T) {
	// A vLLM worker reports no slot count: every stream in flight runs
	// beside the new one, and nothing is predicted to wait in it unless
	// it reports a queue.
	l := newLearner(t)
	trained(t, l, "w", 1, 0.3, 300)
	many := l.p.Predict("w", Input{PromptTokens: 1000, InFlight: 6})
	if many.Wait != 0 {
		t.Errorf("wait %v with no slot count and no queue", many.Wait)
	}
	queued := l.p.Predict("w", Input{PromptTokens: 1000, InFlight: 6, Queue: 2})
	if queued.Wait == 0 || queued.TTFT <= many.TTFT {
		t.Errorf("a reported queue of 2 predicts no wait: %+v", queued)
	}
}

func TestPredictor_SafeForConcurrentUse(t *testing.T) {
	l := newLearner(t)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				w := []string{"a", "b"}[(g+i)%2]
				pr := l.p.Predict(w, Input{PromptTokens: 100 + i, InFlight: i % 5, Slots: 4})
				o := Outcome{PromptTokens: 100 + i, InFlight: i % 5, Slots: 4, MeanConcurrency: float64(i%5 + 1),
					TTFT: time.Duration(20+i) * time.Millisecond, DecodeTPS: 50, OutputTokens: 20, At: time.Unix(int64(i), 0)}
				l.p.Record(w, pr, o)
				l.finish(w, pr, o)
				l.p.Trusted(w)
			}
		}()
	}
	for range 4 {
		<-done
	}
	if got := l.p.Predict("a", Input{PromptTokens: 100}); !got.Known {
		t.Fatalf("not known after 400 outcomes: %+v", got)
	}
}
