// Package predict predicts, per worker, what a request would get if it
// were sent there now — its time to first token and its decode rate, and
// the decode rate left to the streams already running — and holds the
// SLO those predictions are judged against. The scheduler calls Predict
// at every pick, under its own lock, so Predict is cheap and allocates
// nothing; the proxy feeds finished requests back (Observe, Record).
//
// The package is pure: no HTTP, no goroutines, no clock. Every time it
// needs comes in an Outcome.
//
// # The model, per worker
//
// Cards differ, so everything is fitted per worker; nothing assumes two
// workers alike.
//
// Time to first token on the worker (send to first token), in ms, is a
// linear model of what the request finds there when it is sent:
//
//	ttft = d · θ·x,  x = [1, u, o, o·u, a, o²]
//
// with u the uncached prompt tokens (prompt − cached) in thousands, o the
// other streams running beside it (in flight, capped at slots − 1 when
// the slot count is known), a the uncached prompt tokens of requests sent
// before it still prefilling, in thousands (0 when unknown). θ₀ is the
// fixed overhead, θ₁ the prefill time per 1k tokens alone, θ₂ what each
// running stream adds (its token rides in the same step), θ₃ how much
// slower prefill runs per running stream (batch interference), θ₄ the
// prefill queued ahead, θ₅ (a feature o²) the decode steps' own
// interference. d is the drift, the card's speed lately against the
// fitted shape: log d moves by α = 0.2 of log(actual / predicted) at each
// outcome, so a card that slows down is followed within a few requests.
// θ is fitted to ttft/d, the shape without the drift, by recursive least
// squares with exponential forgetting (λ = 0.98, a memory of about 50
// requests), weighted by 1/ttft² so that it minimises relative, not
// absolute, error, and clipping a sample beyond 3× the prediction. The
// two never compete for the same change: d takes what scales every
// request alike, θ what changes the shape. One outcome's log ratio
// counts for at most ±1.6 (a factor of 5).
//
// When the worker's slot count is known and it would be full, the request
// waits inside it for a slot: wait = w · p · hold / slots, with p its
// place in the worker's queue (in flight + 1 − slots, or the worker's own
// queue + 1 when that is longer), hold the moving average of how long a
// stream holds a slot, hold/slots the mean time to the first of its
// streams ending (each with a memoryless remaining time), and w a moving
// average of measured over predicted waits (1 at first). Requests that
// waited are not fitted into θ; they teach w.
//
// The decode rate of a stream at Sluice's concurrency level k (requests
// in flight, itself included, as stats.Level counts them) comes from the
// worker's per-level moving averages, stats.WorkerStats.Levels, which the
// adaptive limits already learn: a weighted least-squares line through
// the levels' seconds per token, 1/r(k) = b₀ + b₁·(k−1) (weights: samples,
// capped at 20, times r² for relative error; b₁ ≥ 0; with a single level
// b₁ = b₀/10, a stated prior), blended with level k's own average when it
// has samples (its samples against 5 for the line), times its own drift
// factor, like d. The streams already running move from level n to n+1
// and are stalled once by this prompt's prefill, (θ₁ + θ₃·o)·u, spread
// over the half of a mean output they have left. The decode drift moves
// like d, against the levels' rate, but one outcome's log ratio counts
// for at most ±0.35: short streams' rates are bimodal (stalled by a
// prompt arriving while they run, or not), and a clipped step settles
// near the median ratio rather than the mean, while ten outcomes still
// move it by ln 2, a card at half speed.
//
// Each prediction also gives the decode rates if the request is sent
// when one running stream has ended (one level lower), and the spread of
// a stream's rate at both levels: the coefficient of variation the
// levels' moving averages measure (stats.Level.StdDev over the mean,
// from the nearest level below with 5 streams when the level has fewer).
// A floor is kept by a share of the streams, not by the mean, and the
// spread says how large a share.
//
// A prediction is Known once the worker's regression has 8 outcomes and
// it has decode history; before that the scheduler should not trust it.
//
// # Use
//
// At each pick the scheduler calls Predict for each candidate worker and
// keeps the chosen worker's Prediction with the request (its decision
// record shows TTFT, Decode and Source). When the request ends the proxy
// calls Record with that prediction and the Outcome, then Observe, then
// the stats.Tracker's Observe, in that order, so the decode drift is
// measured against levels that do not hold the request yet. Observe
// persists the worker's fit through the Tracker (SetFit); a Predictor
// made after a restart starts from the stored fits.
//
// # Trust
//
// Record scores a prediction against the outcome. A worker is untrusted
// (Trusted false, with the reason) while, over its last 32 recorded
// predictions and with at least 8 of them, the median relative TTFT error
// is above 50 % or the median relative decode error above 30 %; the
// scheduler then falls back to its plain score for that worker.
//
// # Concurrency Model
//
// A Predictor is safe for concurrent use: one mutex guards every worker's
// model; Predict holds it for arithmetic only (no I/O, no allocation).
// It calls into its Source (the stats.Tracker) under that mutex, and the
// Tracker never calls back, so there is no lock order to get wrong.
package predict

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// Source is where the predictor reads the per-level decode averages and
// persists its fitted models: a *stats.Tracker.
type Source interface {
	// Stats returns worker's current, immutable stats, or nil.
	Stats(worker string) *stats.WorkerStats
	// SetFit replaces worker's persisted fit.
	SetFit(worker string, f *stats.Fit, now time.Time)
}

// Outcome is what one finished request did on a worker. Zero fields are
// unknown and not learnt from.
type Outcome struct {
	// PromptTokens is the prompt's length; CachedTokens how many of them
	// the worker found in its cache (0 when not reported).
	PromptTokens, CachedTokens int
	// PrefillAhead is the uncached prompt tokens of requests sent to the
	// worker before this one and still without a first token when it was
	// sent; 0 when unknown.
	PrefillAhead int
	// InFlight is the streams in flight on the worker (all replicas) when
	// it was sent, itself not counted; Slots the worker's reported slots
	// then (0: unknown).
	InFlight, Slots int
	// MeanConcurrency is the mean number of requests in flight on the
	// worker while it ran, itself included (stats.Observation's
	// Concurrency).
	MeanConcurrency float64
	// TTFT is from sending it to the worker to its first token.
	TTFT time.Duration
	// DecodeTPS is its decode rate after the first token.
	DecodeTPS float64
	// OutputTokens is how many tokens it produced.
	OutputTokens int
	// At is when it finished.
	At time.Time
}

// Input describes a request and the state of the worker it might go to.
type Input struct {
	// PromptTokens is the prompt's length; CachedTokens how many of its
	// leading tokens the worker is expected to hold in its prefix cache.
	PromptTokens, CachedTokens int
	// OutputTokens is the expected output length (0: the worker's mean).
	OutputTokens int
	// InFlight is the streams in flight on the worker now (all replicas).
	InFlight int
	// Slots is the worker's reported slot count; 0 when unknown.
	Slots int
	// Queue is the length of the worker's own queue (requests deferred),
	// as it reports it.
	Queue int
	// PrefillAhead is as in Outcome: uncached prompt tokens sent to the
	// worker and still prefilling; 0 when unknown.
	PrefillAhead int
}

// Prediction is what a request is predicted to get on one worker.
type Prediction struct {
	// TTFT is the time to first token on the worker if sent now, Wait
	// included.
	TTFT time.Duration
	// Wait is the part of TTFT spent queued inside the worker.
	Wait time.Duration
	// TTFTAfterOne is the time to first token if it is sent when one of
	// the worker's streams has ended, counted from then (the scheduler
	// adds its own queue wait), and FreeIn when that is expected: the
	// mean time to the first of the running streams ending.
	TTFTAfterOne, FreeIn time.Duration
	// Decode is the predicted decode rate of the new stream, tokens/s;
	// DecodeOthers that of the streams already running once it is added
	// (0 when none run). Both 0 when the worker has no decode history.
	Decode, DecodeOthers float64
	// DecodeAfterOne and DecodeOthersAfterOne are the same if it is sent
	// when one of the running streams has ended (at TTFTAfterOne).
	DecodeAfterOne, DecodeOthersAfterOne float64
	// DecodeCV and DecodeCVAfterOne are the spread of a stream's decode
	// rate at the level it would run at, now and after one stream ends:
	// the coefficient of variation measured at that level (0 when too few
	// streams ran there). Decode·(1 − z·CV) is the rate all but the
	// slowest streams there beat, what a decode floor is judged by.
	DecodeCV, DecodeCVAfterOne float64
	// E2E is TTFT plus the expected output at Decode.
	E2E time.Duration
	// Known reports enough history for the prediction to be used.
	Known bool
	// Source says what the prediction rests on, for the decision record.
	Source string
}

// Sources of a prediction, as Prediction.Source says them.
const (
	SourceFit       = "fit: ttft regression + decode levels"
	SourceNoTTFT    = "prior: too few outcomes for the ttft regression"
	SourceNoDecode  = "fit: ttft regression; no decode history"
	SourceNoHistory = "prior: no history"
)

// Tuning of the model, stated in the package doc.
const (
	nx         = 6    // regression features
	forget     = 0.98 // RLS forgetting factor
	driftAlpha = 0.2  // EMA factor of the drifts, the hold time and the wait scale
	minSamples = 8    // outcomes before the TTFT regression is trusted to predict
	levelCap   = 20   // most samples a level weighs with
	blendLine  = 5    // weight of the fitted line against a level's own samples
	errWindow  = 32   // predictions the trust rule looks back on
	errMin     = 8    // recorded predictions before trust is judged
	maxTTFTErr = 0.5  // median relative TTFT error above which a worker is untrusted
	maxDecErr  = 0.3  // same for the decode rate
	soloSlope  = 0.1  // prior: each extra stream costs 10 % of a solo token's time
	ttftClip   = 1.6  // most one TTFT outcome's log ratio counts (×5)
	decodeClip = 0.35 // most one decode outcome's log ratio counts (×1.4)
)

// prior θ (ms): no overhead, 5,000 tokens/s prefill, a 13 ms decode step
// per running stream, 10 % interference per stream, and queued prefill
// at the same rate; priorP its variance, wide enough that a few outcomes
// override it.
var (
	priorTheta = [nx]float64{0, 200, 13, 20, 200, 1}
	priorP     = [nx]float64{1e6, 1e6, 1e4, 1e4, 1e6, 1e2}
)

// Predictor learns and predicts every worker's latencies.
type Predictor struct {
	src Source

	mu      sync.Mutex
	workers map[string]*model
}

// model is one worker's fitted state.
type model struct {
	theta   [nx]float64
	p       [nx][nx]float64
	samples int64

	ttftDrift, decodeDrift stats.EMA // of log(actual/model)
	dT, dD                 float64   // their factors, exp(Value), kept by refresh
	hold, waitScale        stats.EMA // ms; ratio

	ttftErrs, decodeErrs ring
	ttftRun, decodeRun   Tally // since the process started; not persisted

	// line through the decode levels, cached for the stats value it was
	// fitted to (immutable, so a pointer identifies it).
	lineOf *stats.WorkerStats
	b0, b1 float64 // s per token at level 1, per extra stream; b0 0: none
}

// New returns a Predictor reading decode levels from, and persisting its
// fits to, src (a *stats.Tracker). Workers whose stats already hold a fit
// (from before a restart) start from it.
func New(src Source) *Predictor {
	return &Predictor{src: src, workers: map[string]*model{}}
}

// modelLocked returns worker's model, loading a persisted fit the first
// time. p.mu must be held.
func (p *Predictor) modelLocked(worker string) *model {
	if m := p.workers[worker]; m != nil {
		return m
	}
	m := &model{}
	m.reset()
	m.refresh()
	if ws := p.src.Stats(worker); ws != nil && ws.Fit != nil {
		m.load(ws.Fit)
	}
	p.workers[worker] = m
	return m
}

func (m *model) reset() {
	m.theta = priorTheta
	m.p = [nx][nx]float64{}
	for i := range nx {
		m.p[i][i] = priorP[i]
	}
}

// load restores a persisted fit; one of another shape (another version)
// is ignored and the model starts afresh.
func (m *model) load(f *stats.Fit) {
	if len(f.Theta) == nx && len(f.P) == nx*nx {
		copy(m.theta[:], f.Theta)
		for i := range nx {
			copy(m.p[i][:], f.P[i*nx:(i+1)*nx])
		}
		m.samples = f.Samples
	}
	m.ttftDrift, m.decodeDrift = f.TTFTDrift, f.DecodeDrift
	m.hold, m.waitScale = f.HoldMs, f.WaitScale
	m.ttftErrs.load(f.TTFTErrs)
	m.decodeErrs.load(f.DecodeErrs)
	m.refresh()
}

// refresh recomputes the drift factors after the drifts changed.
func (m *model) refresh() { m.dT, m.dD = drift(m.ttftDrift), drift(m.decodeDrift) }

// fit returns the model's state to persist.
func (m *model) fit(now time.Time) *stats.Fit {
	f := &stats.Fit{
		Theta: slices.Clone(m.theta[:]), P: make([]float64, 0, nx*nx), Samples: m.samples,
		TTFTDrift: m.ttftDrift, DecodeDrift: m.decodeDrift, HoldMs: m.hold, WaitScale: m.waitScale,
		TTFTErrs: m.ttftErrs.values(), DecodeErrs: m.decodeErrs.values(), Updated: now,
	}
	for i := range nx {
		f.P = append(f.P, m.p[i][:]...)
	}
	return f
}

// features returns x for u uncached prompt tokens, o running others and
// a tokens of prefill ahead.
func features(u, o, a int) [nx]float64 {
	uk, of := float64(u)/1000, float64(o)
	return [nx]float64{1, uk, of, of * uk, float64(a) / 1000, of * of}
}

func dot(a, b *[nx]float64) float64 {
	var s float64
	for i := range nx {
		s += a[i] * b[i]
	}
	return s
}

// ttftModel returns θ·x in ms, at least 0.1 ms.
func (m *model) ttftModel(x *[nx]float64) float64 { return max(dot(&m.theta, x), 0.1) }

// drift returns the factor of a drift EMA.
func drift(e stats.EMA) float64 {
	if !e.Known() {
		return 1
	}
	return math.Exp(e.Value)
}

// place returns the streams running beside a request sent with inFlight
// in flight, and its place in the worker's queue (0: it gets a slot now).
func place(inFlight, slots, queue int) (others, pos int) {
	others = inFlight
	if slots > 0 {
		others = min(inFlight, slots-1)
		pos = max(inFlight+1-slots, 0)
	}
	if queue > 0 {
		pos = max(pos, queue+1)
	}
	return others, pos
}

// waitMs returns the predicted in-worker wait at place pos, in ms.
func (m *model) waitMs(pos, slots, inFlight int) float64 {
	if pos == 0 || !m.hold.Known() {
		return 0
	}
	running := slots
	if running <= 0 {
		running = max(inFlight, 1)
	}
	w := 1.0
	if m.waitScale.Known() {
		w = m.waitScale.Value
	}
	return w * float64(pos) * m.hold.Value / float64(running)
}

// Observe learns from one finished request on worker. Call it before the
// stats.Tracker folds the same request, so the decode drift is measured
// against levels that do not include it yet.
func (p *Predictor) Observe(worker string, o Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	ws := p.src.Stats(worker)
	u := max(o.PromptTokens-max(o.CachedTokens, 0), 0)
	others, pos := place(o.InFlight, o.Slots, 0)
	x := features(u, others, o.PrefillAhead)
	prefillMs := 0.0 // the TTFT without the in-worker wait
	if o.TTFT > 0 {
		y := ms(o.TTFT)
		yhat := m.ttftModel(&x)
		if pos == 0 {
			if m.samples >= minSamples {
				m.ttftDrift = nudge(m.ttftDrift, y/(yhat*m.dT), ttftClip)
			}
			m.rls(&x, y/m.dT)
			prefillMs = y
		} else {
			prefillMs = yhat * m.dT
			if pw := m.waitMs(pos, o.Slots, o.InFlight); pw > 0 {
				m.waitScale = m.waitScale.Add(min(max(y-prefillMs, 0)/pw, 5), driftAlpha)
			}
		}
	}
	if math.IsInf(o.DecodeTPS, 0) || math.IsNaN(o.DecodeTPS) {
		o.DecodeTPS = 0
	}
	if o.DecodeTPS > 0 && o.OutputTokens > 1 && prefillMs > 0 {
		m.hold = m.hold.Add(prefillMs+float64(o.OutputTokens-1)/o.DecodeTPS*1000, driftAlpha)
	}
	if o.DecodeTPS > 0 && o.MeanConcurrency > 0 {
		if r := m.levelRate(ws, stats.LevelOf(o.MeanConcurrency)); r > 0 {
			m.decodeDrift = nudge(m.decodeDrift, o.DecodeTPS/(r*m.dD), decodeClip)
		}
	}
	m.refresh()
	p.src.SetFit(worker, m.fit(o.At), o.At)
}

// nudge moves a drift (the log of a factor) by driftAlpha of the log of
// ratio, actual over the drifted prediction: a feedback loop, which
// settles where the drifted predictions meet the outcomes, whatever the
// fit underneath does meanwhile.
func nudge(e stats.EMA, ratio, clip float64) stats.EMA {
	return stats.EMA{Value: e.Value + driftAlpha*min(max(math.Log(ratio), -clip), clip), N: e.N + 1}
}

// rls folds one sample into θ: weighted recursive least squares with
// forgetting, the weight 1/y² making the fit minimise relative error.
// Once the fit has history, an outlier is clipped to 3× (or a third of)
// the prediction so one collision does not throw the fit. P's diagonal
// is kept under the prior's, so a feature that stays 0 (no prefill-ahead
// counts) does not wind up P under forgetting.
func (m *model) rls(x *[nx]float64, y float64) {
	yhat := dot(&m.theta, x)
	if m.samples >= minSamples && yhat > 0 {
		y = min(max(y, yhat/3), 3*yhat)
	}
	var px [nx]float64
	for i := range nx {
		px[i] = dot(&m.p[i], x)
	}
	den := forget*y*y + dot(x, &px) // λ/w + xᵀPx with w = 1/y²
	if !(den > 0) {
		return
	}
	e := y - yhat
	for i := range nx {
		m.theta[i] += px[i] / den * e
	}
	for i := range nx {
		for j := range nx {
			m.p[i][j] = (m.p[i][j] - px[i]*px[j]/den) / forget
		}
	}
	for i := range nx {
		if m.p[i][i] > priorP[i] {
			c := math.Sqrt(priorP[i] / m.p[i][i])
			for j := range nx {
				m.p[i][j] *= c
				m.p[j][i] *= c
			}
		}
	}
	m.samples++
}

// line fits (and caches) 1/r(k) = b0 + b1·(k−1) through ws's levels.
func (m *model) line(ws *stats.WorkerStats) {
	if ws == m.lineOf {
		return
	}
	m.lineOf = ws
	m.b0, m.b1 = 0, 0
	if ws == nil {
		return
	}
	var sw, sx, sy, sxx, sxy float64
	for k, l := range ws.Levels.All() {
		if l.DecodeTPS.N == 0 || l.DecodeTPS.Value <= 0 {
			continue
		}
		r := l.DecodeTPS.Value
		w := float64(min(l.DecodeTPS.N, levelCap)) * r * r
		x, y := float64(k-1), 1/r
		sw += w
		sx += w * x
		sy += w * y
		sxx += w * x * x
		sxy += w * x * y
	}
	if sw == 0 {
		return
	}
	mx, my := sx/sw, sy/sw
	if v := sxx/sw - mx*mx; v > 1e-9 {
		b1 := max((sxy/sw-mx*my)/v, 0)
		if b0 := my - b1*mx; b0 > 0 {
			m.b0, m.b1 = b0, b1
			return
		}
	}
	// One level, or a line through the origin: the prior slope through
	// the levels' mean.
	m.b0 = my / (1 + soloSlope*mx)
	m.b1 = soloSlope * m.b0
}

// levelRate returns the modelled decode rate at level k (no drift), 0
// when the worker has no decode history.
func (m *model) levelRate(ws *stats.WorkerStats, k int) float64 {
	m.line(ws)
	if m.b0 <= 0 {
		return 0
	}
	r := 1 / (m.b0 + m.b1*float64(k-1))
	if l := ws.Level(k); l.DecodeTPS.N > 0 && l.DecodeTPS.Value > 0 {
		n := float64(min(l.DecodeTPS.N, levelCap))
		r = (n*l.DecodeTPS.Value + blendLine*r) / (n + blendLine)
	}
	return r
}

// Predict returns what a request described by in would get on worker if
// sent now. It allocates nothing.
func (p *Predictor) Predict(worker string, in Input) Prediction {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	ws := p.src.Stats(worker)
	u := max(in.PromptTokens-max(in.CachedTokens, 0), 0)

	var pr Prediction
	d := m.dT
	others, pos := place(in.InFlight, in.Slots, in.Queue)
	x := features(u, others, in.PrefillAhead)
	wait := m.waitMs(pos, in.Slots, in.InFlight)
	pr.Wait = dur(wait)
	pr.TTFT = dur(d*m.ttftModel(&x) + wait)
	// One stream later: one fewer in flight, the worker's queue one
	// shorter, the prefill ahead unchanged (it may still run).
	others1, pos1 := place(max(in.InFlight-1, 0), in.Slots, max(in.Queue-1, 0))
	x1 := features(u, others1, in.PrefillAhead)
	pr.TTFTAfterOne = dur(d*m.ttftModel(&x1) + m.waitMs(pos1, in.Slots, in.InFlight-1))
	running := in.InFlight
	if in.Slots > 0 {
		running = min(running, in.Slots)
	}
	if running > 0 && m.hold.Known() {
		pr.FreeIn = dur(m.hold.Value / float64(running))
	}

	k := min(in.InFlight+1, stats.MaxLevels)
	if r := m.levelRate(ws, k); r > 0 {
		r *= m.dD
		pr.Decode = r
		pr.DecodeOthers = m.othersRate(ws, r, in.InFlight, others, u, d)
		pr.DecodeCV = levelCV(ws, k)
		if in.InFlight > 0 {
			k1 := min(in.InFlight, stats.MaxLevels)
			if r1 := m.levelRate(ws, k1); r1 > 0 {
				r1 *= m.dD
				pr.DecodeAfterOne = r1
				pr.DecodeOthersAfterOne = m.othersRate(ws, r1, in.InFlight-1, others1, u, d)
				pr.DecodeCVAfterOne = levelCV(ws, k1)
			}
		} else {
			pr.DecodeAfterOne, pr.DecodeCVAfterOne = pr.Decode, pr.DecodeCV
		}
		out := float64(in.OutputTokens)
		if out <= 0 && ws != nil {
			out = ws.OutputTokens.Value
		}
		pr.E2E = pr.TTFT + dur(max(out-1, 0)/r*1000)
	}
	switch {
	case m.samples < minSamples && pr.Decode == 0:
		pr.Source = SourceNoHistory
	case m.samples < minSamples:
		pr.Source = SourceNoTTFT
	case pr.Decode == 0:
		pr.Source = SourceNoDecode
	default:
		pr.Source, pr.Known = SourceFit, true
	}
	return pr
}

// othersRate is the decode rate left to the running streams beside a new
// one at rate r: running of them, one level up, stalled once by its
// prefill of u tokens (with others streams in the batch, d the TTFT
// drift) over the half of a mean output they have left; 0 when none run.
func (m *model) othersRate(ws *stats.WorkerStats, r float64, running, others, u int, d float64) float64 {
	if running <= 0 {
		return 0
	}
	stall := max(m.theta[1]+m.theta[3]*float64(others), 0) * float64(u) / 1000 * d / 1000 // s
	left := 0.0
	if ws != nil && ws.OutputTokens.Known() {
		left = ws.OutputTokens.Value / 2
	}
	left = max(left, 1)
	return left / (left/r + stall)
}

// minSpreadSamples is how many streams a level needs before its spread
// is trusted.
const minSpreadSamples = 5

// levelCV is the coefficient of variation of the decode rate at level k,
// or of the nearest level below with enough samples (a level's spread
// only grows with k, so the one below is the optimistic stand-in); 0 when
// none has.
func levelCV(ws *stats.WorkerStats, k int) float64 {
	if ws == nil {
		return 0
	}
	for j := k; j >= 1; j-- {
		l := ws.Level(j)
		if l.DecodeTPS.N >= minSpreadSamples && l.DecodeTPS.Value > 0 {
			return l.StdDev() / l.DecodeTPS.Value
		}
	}
	return 0
}

// Unloaded returns what worker does with nothing else running, as
// fitted, for DefaultSLO; false when it has too little history.
func (p *Predictor) Unloaded(worker string) (Unloaded, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	if m.samples < minSamples {
		return Unloaded{}, false
	}
	u := Unloaded{Overhead: dur(max(m.theta[0], 0) * m.dT)}
	if m.theta[1] > 0 {
		u.PrefillPer1k = dur(m.theta[1] * m.dT)
	}
	if r := m.levelRate(p.src.Stats(worker), 1); r > 0 {
		u.SoloDecode = r * m.dD
	}
	return u, true
}

// Record scores a prediction made for a request against its outcome,
// keeping the worker's relative errors for Trusted. Predictions that were
// not Known are not scored.
func (p *Predictor) Record(worker string, predicted Prediction, actual Outcome) {
	if !predicted.Known {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	if actual.TTFT > 0 && predicted.TTFT > 0 {
		e := math.Abs(float64(predicted.TTFT-actual.TTFT)) / float64(actual.TTFT)
		m.ttftErrs.add(e)
		m.ttftRun.Add(e)
	}
	if actual.DecodeTPS > 0 && predicted.Decode > 0 {
		e := math.Abs(predicted.Decode-actual.DecodeTPS) / actual.DecodeTPS
		m.decodeErrs.add(e)
		m.decodeRun.Add(e)
	}
}

// Forget drops worker's model: the worker has left the fleet. Its fit
// stays persisted with its stats, and a worker that comes back under the
// name starts from it.
func (p *Predictor) Forget(worker string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.workers, worker)
}

// Len returns how many workers the predictor holds a model of.
func (p *Predictor) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.workers)
}

// MedianErrors returns the median relative TTFT and decode prediction
// errors over worker's last recorded predictions (up to 32), and how many
// each median is over: what Trusted judges, for dashboards and reports.
func (p *Predictor) MedianErrors(worker string) (ttft, decode float64, nTTFT, nDecode int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	return m.ttftErrs.median(), m.decodeErrs.median(), m.ttftErrs.n, m.decodeErrs.n
}

// RunErrors returns the tallies of worker's relative TTFT and decode
// prediction errors since this Predictor was made: over a benchmark run,
// the whole run.
func (p *Predictor) RunErrors(worker string) (ttft, decode Tally) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	return m.ttftRun, m.decodeRun
}

// Trusted reports whether worker's predictions have held up (see the
// package doc's rule); when not, reason says which error broke it and by
// how much. A worker with fewer than 8 recorded predictions is trusted.
func (p *Predictor) Trusted(worker string) (ok bool, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.modelLocked(worker)
	if m.ttftErrs.n >= errMin {
		if med := m.ttftErrs.median(); med > maxTTFTErr {
			return false, "median TTFT prediction error " + pct(med) + " over the last " + strconv.Itoa(m.ttftErrs.n) + " > 50%"
		}
	}
	if m.decodeErrs.n >= errMin {
		if med := m.decodeErrs.median(); med > maxDecErr {
			return false, "median decode prediction error " + pct(med) + " over the last " + strconv.Itoa(m.decodeErrs.n) + " > 30%"
		}
	}
	return true, ""
}

// ring keeps the last errWindow errors.
type ring struct {
	v    [errWindow]float64
	next int // where the next goes
	n    int // how many are held
}

func (r *ring) add(x float64) {
	r.v[r.next] = x
	r.next = (r.next + 1) % errWindow
	r.n = min(r.n+1, errWindow)
}

// values returns the held errors, oldest first.
func (r *ring) values() []float64 {
	if r.n == 0 {
		return nil
	}
	out := make([]float64, 0, r.n)
	for i := range r.n {
		out = append(out, r.v[(r.next-r.n+i+errWindow)%errWindow])
	}
	return out
}

func (r *ring) load(vs []float64) {
	*r = ring{}
	for _, x := range vs[max(len(vs)-errWindow, 0):] {
		r.add(x)
	}
}

func (r *ring) median() float64 {
	if r.n == 0 {
		return 0
	}
	s := r.v // a copy on the stack
	w := s[:r.n]
	slices.Sort(w)
	if r.n%2 == 1 {
		return w[r.n/2]
	}
	return (w[r.n/2-1] + w[r.n/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func dur(msf float64) time.Duration {
	if !(msf > 0) {
		return 0
	}
	return time.Duration(min(msf*float64(time.Millisecond), math.MaxInt64/2))
}

func pct(x float64) string { return strconv.Itoa(int(math.Round(x*100))) + "%" }
