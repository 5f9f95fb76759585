package predict

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/stats"
)

// trafficSpec is open-loop traffic on one simulated card: Poisson
// arrivals, log-normal prompt lengths (the card's engine draws the output
// lengths from its own Params).
type trafficSpec struct {
	rate         float64 // requests per second
	promptMedian float64
	promptSigma  float64
	n            int
	seed         uint64
}

// sent is one request as the harness saw it at send time.
type sent struct {
	in        Input
	at        time.Time
	area0     float64 // ∫ in-flight dt at send, for its mean concurrency
	firstTok  time.Time
	predicted Prediction
}

// drive runs traffic through one sim.Engine in virtual time, as Sluice
// in front of the card would: at each send it asks predict for its Input,
// at each finish it hands over the Outcome, in time order. It returns
// nothing: the callbacks keep what the test needs.
func drive(t testing.TB, p sim.Params, tr trafficSpec, onSend func(Input, time.Time) Prediction, onDone func(Prediction, Outcome, int)) {
	t.Helper()
	start := time.Unix(1_800_000_000, 0)
	eng := sim.NewEngine(p, start)
	rng := rand.New(rand.NewPCG(tr.seed, 0x9e3779b97f4a7c15))

	inflight, prefilling := 0, map[*sent]int{}
	var area float64
	last := start
	change := func(at time.Time, delta int) {
		area += float64(inflight) * at.Sub(last).Seconds()
		last = at
		inflight += delta
	}
	prefillAhead := func() int {
		s := 0
		for _, u := range prefilling {
			s += u
		}
		return s
	}

	next := start
	submitted, done := 0, 0
	arrive := func() {
		next = next.Add(time.Duration(rng.ExpFloat64() / tr.rate * float64(time.Second)))
	}
	arrive()
	for done < tr.n {
		ev, busy := eng.NextEvent()
		if submitted < tr.n && (!busy || !next.After(ev)) {
			eng.AdvanceTo(next)
			now := next
			prompt := int(math.Round(tr.promptMedian * math.Exp(tr.promptSigma*rng.NormFloat64())))
			prompt = min(max(prompt, 16), 6000)
			s := &sent{at: now, in: Input{PromptTokens: prompt, InFlight: inflight, Slots: p.Slots, PrefillAhead: prefillAhead()}}
			s.predicted = onSend(s.in, now)
			change(now, +1)
			s.area0 = area
			prefilling[s] = prompt
			idx := submitted
			submitted++
			_, err := eng.Submit(now, sim.Request{PromptTokens: prompt}, sim.Callbacks{
				OnFirstToken: func(at time.Time) {
					s.firstTok = at
					delete(prefilling, s)
				},
				OnDone: func(at time.Time, res sim.Result) {
					change(at, -1)
					done++
					o := Outcome{
						PromptTokens: res.PromptTokens, CachedTokens: res.CachedTokens,
						PrefillAhead: s.in.PrefillAhead, InFlight: s.in.InFlight, Slots: s.in.Slots,
						TTFT: res.FirstToken.Sub(res.Submitted), OutputTokens: res.CompletionTokens, At: at,
					}
					if life := at.Sub(s.at).Seconds(); life > 0 {
						o.MeanConcurrency = (area - s.area0) / life
					}
					if res.CompletionTokens > 1 {
						o.DecodeTPS = float64(res.CompletionTokens-1) / res.Finished.Sub(res.FirstToken).Seconds()
					}
					onDone(s.predicted, o, idx)
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			arrive()
			continue
		}
		if !busy {
			t.Fatalf("engine idle with %d of %d done", done, tr.n)
		}
		eng.AdvanceTo(ev)
	}
}

// learner is a Predictor with the stats.Tracker the router would feed,
// driven as the router will: Predict at send, then at the end Record,
// Observe and the tracker's Observe.
type learner struct {
	tr *stats.Tracker
	p  *Predictor
}

func newLearner(t testing.TB) *learner {
	t.Helper()
	tr, err := stats.NewTracker(0.2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &learner{tr: tr, p: New(tr)}
}

func (l *learner) finish(worker string, pred Prediction, o Outcome) {
	l.p.Record(worker, pred, o)
	l.p.Observe(worker, o)
	l.tr.Observe(worker, stats.Observation{
		TTFT: o.TTFT, OutputTokens: o.OutputTokens, DecodeTPS: o.DecodeTPS, Concurrency: o.MeanConcurrency,
	}, o.At)
}

// relErrs collects relative errors of known predictions.
type relErrs struct{ ttft, decode []float64 }

func (r *relErrs) add(pred Prediction, o Outcome) {
	if !pred.Known {
		return
	}
	if o.TTFT > 0 {
		r.ttft = append(r.ttft, math.Abs(float64(pred.TTFT-o.TTFT))/float64(o.TTFT))
	}
	if o.DecodeTPS > 0 && pred.Decode > 0 {
		r.decode = append(r.decode, math.Abs(pred.Decode-o.DecodeTPS)/o.DecodeTPS)
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// card returns the sim's default card at speed, with slots and batch.
func card(speed float64, slots, batch int, seed int64) sim.Params {
	p := sim.DefaultParams()
	p.Speed, p.Slots, p.BatchTokens, p.Seed = speed, slots, batch, seed
	return p
}
