package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
)

// Admission by promise (Config.Admission "slo", docs/routing.md): a
// request's promise is its SLO, a first token within its objective and a
// decode rate no lower than its floor. With a Predictor each eligible
// worker is asked what the request would get there now, and the request
// binds to the best-scored worker predicted to keep it, waits when
// waiting for a stream to end is predicted to keep it better, or else is
// served where its first token comes soonest or refused, as its SLO's
// on_miss says. A worker whose predictions are not yet trusted is judged
// by its learned limit. The stage runs after the candidates (it needs
// their prefix match) and before the picker, dropping workers with the
// reason whySLO; baselines never run it.

// Admission modes (Config.Admission).
const (
	// AdmitByLimits judges workers by their learned concurrency limits.
	AdmitByLimits = "limits"
	// AdmitBySLO judges them by the predicted promise (above).
	AdmitBySLO = "slo"
)

// ErrSLOUnmeetable refuses a request no worker is predicted to serve
// within its SLO, now or after waiting, when its SLO says on_miss: refuse.
var ErrSLOUnmeetable = errors.New("no worker is predicted to meet this request's SLO, now or after waiting")

// promiseOn reports whether the promise stage runs for p.
func (s *Scheduler) promiseOn(p *pick) bool {
	return s.cfg.Predictor != nil && s.cfg.Admission == AdmitBySLO && !p.baseline
}

// sloOf resolves the SLO of p's request: its own fields, then its
// class's, then the configured default, else d's, derived from what the
// model's workers do unloaded.
func (p *pick) sloOf(d *derived) predict.SLO {
	cfg := p.conf.cfg
	slo := p.req.SLO
	if c, ok := cfg.SLOs[p.req.Class]; ok {
		slo = slo.Or(c)
	}
	if cfg.DefaultSLO != (predict.SLO{}) {
		return slo.Or(cfg.DefaultSLO)
	}
	return slo.Or(d.slo)
}

// derivedLocked returns what is derived of model from its workers
// unloaded, derived again every sloRefresh.
func (s *Scheduler) derivedLocked(model string, now time.Time) *derived {
	d := s.derivedSLO[model]
	if d != nil && now.Sub(d.at) < sloRefresh {
		return d
	}
	var fleet []predict.Unloaded
	var fastest time.Duration
	if s.cfg.Predictor != nil {
		for _, w := range s.workers {
			if !w.serves(w.snapshot(), model) {
				continue
			}
			if u, ok := s.cfg.Predictor.Unloaded(w.spec.Name); ok {
				fleet = append(fleet, u)
				if u.PrefillPer1k > 0 && (fastest == 0 || u.PrefillPer1k < fastest) {
					fastest = u.PrefillPer1k
				}
			}
		}
	}
	d = &derived{slo: predict.DefaultSLO(fleet), prefillPer1k: fastest, at: now}
	s.derivedSLO[model] = d
	return d
}

// derived is what was last derived of a model from its workers unloaded:
// its default SLO and its fastest worker's prefill time per 1,000 prompt
// tokens (0 while unknown).
type derived struct {
	slo          predict.SLO
	prefillPer1k time.Duration
	at           time.Time
}

// sloRefresh is how often a model's derived default SLO is derived again.
const sloRefresh = 10 * time.Second

// inputFor describes p's request on the worker of view v, candidate c.
func (p *pick) inputFor(v *view, c *Candidate) predict.Input {
	return predict.Input{
		PromptTokens: p.req.PromptTokens,
		CachedTokens: int(math.Round(clamp01(c.PrefixMatch) * float64(p.req.PromptTokens))),
		OutputTokens: int(math.Round(p.out)),
		InFlight:     v.active + v.remote, // as worker.inFlight
		Slots:        v.snap.Slots,
		Queue:        int(max(v.snap.QueueLen.Value, 0)),
	}
}

// promiseStage resolves p's SLO (d as sloOf says) and objective, then
// keeps the workers predicted to keep p's promise, or decides that the
// request waits, is served where it misses least, or is refused.
//
// A decode floor is kept by most streams, not by the median one, so each
// worker's chance of keeping it, for the new stream and for those already
// running there, comes from the predicted rate and the spread measured at
// that level (floorChance). The request binds now unless waiting for the
// first stream to end is predicted likelier to keep every promise
// involved (the wait taken as memoryless, of mean FreeIn); a chance of at
// least surelyKept binds at once.
func (p *pick) promiseStage(d *derived) {
	pm := &p.promise
	pm.slo = p.sloOf(d)
	cached := 0
	for j := range p.cands {
		cached = max(cached, int(clamp01(p.cands[j].PrefixMatch)*float64(p.req.PromptTokens)))
	}
	// The objective allows for the prefill of what no worker is expected
	// to hold: the most cached anywhere is what it could skip.
	pm.objective = pm.slo.Deadline(p.req.PromptTokens, cached)
	if pm.objective <= 0 {
		pm.objective = math.MaxInt64 / 4 // no TTFT objective: any time meets it
	}
	remaining := pm.objective - p.env.Now.Sub(p.arrived)
	n := len(p.elig)
	p.preds, p.meets = make([]predict.Prediction, n), make([]bool, n)
	preds, meets := p.preds, p.meets
	floor := pm.slo.MinDecode
	bestWait, waitChance := p.predict(remaining)
	bestNow := time.Duration(math.MaxInt64)
	any, judged := false, 0
	nowChance := 0.0 // the best chance of keeping it by binding now
	for j := range n {
		v, pr := p.at(j), &preds[j]
		if !meets[j] {
			meets[j] = v.active < v.lim.limit // judged as by the limits
			any = any || meets[j]
			continue
		}
		judged++
		bestNow = min(bestNow, pr.TTFT)
		chance := floorChance(pr.Decode, pr.DecodeCV, floor) * floorChance(pr.DecodeOthers, pr.DecodeCV, floor)
		meets[j] = pr.TTFT <= remaining && chance > 0
		if meets[j] {
			any = true
			nowChance = max(nowChance, chance)
		}
	}
	if judged > 0 && nowChance < surelyKept && nowChance < waitChance {
		// Waiting keeps the promise more surely than any worker now. A
		// worker judged by its limits has an unknown chance, taken as no
		// better: it is let go too, unless it has no prediction at all.
		for j := range n {
			if preds[j].Known {
				meets[j] = false
			}
		}
		any = slices.Contains(meets, true)
	}
	switch {
	case any:
		pm.verdict = verdictMeets
	case judged == 0:
		pm.verdict = verdictLimits // nobody judged by prediction: wait as ever
	case waitChance > 0 || (bestWait <= remaining && bestWait < bestNow):
		pm.verdict, pm.wait = verdictWait, bestWait
	case pm.slo.OnMiss == predict.OnMissRefuse:
		pm.verdict = verdictRefuse
	default:
		// Served where its first token is predicted soonest.
		pm.verdict = verdictServe
		for j := range n {
			meets[j] = preds[j].Known && preds[j].TTFT == bestNow
		}
	}
	pm.remaining, pm.nowChance, pm.waitChance = remaining, nowChance, waitChance
	keep := 0
	for j := range n {
		if meets[j] {
			p.elig[keep], p.cands[keep], preds[keep] = p.elig[j], p.cands[j], preds[j]
			keep++
			continue
		}
		p.at(j).why = whySLO
	}
	p.elig, p.cands, p.preds = p.elig[:keep], p.cands[:keep], preds[:keep]
}

// predict predicts p's request on each eligible worker into p.preds and
// marks in p.meets those judged by prediction (known and trusted); it
// returns the soonest first token after waiting for a stream to end, and
// the best chance of keeping the promise by waiting.
func (p *pick) predict(remaining time.Duration) (bestWait time.Duration, waitChance float64) {
	preds, meets, floor := p.preds, p.meets, p.promise.slo.MinDecode
	predictor := p.conf.cfg.Predictor
	bestWait = time.Duration(math.MaxInt64)
	for j := range preds {
		v, c := p.at(j), &p.cands[j]
		preds[j] = predictor.Predict(c.Name, p.inputFor(v, c))
		pr := &preds[j]
		// meets says whether the worker is judged by prediction until
		// promiseStage decides it.
		ok, _ := predictor.Trusted(c.Name)
		meets[j] = pr.Known && ok
		if !meets[j] || pr.FreeIn <= 0 {
			continue
		}
		after := pr.FreeIn + pr.TTFTAfterOne
		bestWait = min(bestWait, after)
		if after <= remaining {
			inTime := 1 - math.Exp(-float64(remaining-pr.TTFTAfterOne)/float64(pr.FreeIn))
			waitChance = max(waitChance, inTime*
				floorChance(pr.DecodeAfterOne, pr.DecodeCVAfterOne, floor)*
				floorChance(pr.DecodeOthersAfterOne, pr.DecodeCVAfterOne, floor))
		}
	}
	return bestWait, waitChance
}

// surelyKept is the chance of keeping its floor at which a request binds
// now whatever waiting might add: the share of requests that must keep
// their promise for a load to count as goodput. Closer chances than this
// are within the predictions' error, and waiting on them leaves slots idle.
const surelyKept = 0.95

// floorChance is the chance that a stream predicted to decode at rate,
// with coefficient of variation cv at its level, keeps floor, its rate
// taken as log-normal about the prediction. 1 without a floor or a rate;
// 1 or 0 while no spread is known.
func floorChance(rate, cv, floor float64) float64 {
	if floor <= 0 || rate == 0 {
		return 1
	}
	if cv <= 0 {
		if rate >= floor {
			return 1
		}
		return 0
	}
	sigma := math.Sqrt(math.Log1p(cv * cv))
	return 0.5 * math.Erfc(-math.Log(rate/floor)/(sigma*math.Sqrt2))
}

// The promise stage's verdicts.
const (
	verdictNone   uint8 = iota // the stage did not run
	verdictMeets               // some worker is predicted to keep the promise
	verdictLimits              // no worker is judged by prediction yet
	verdictWait                // waiting is predicted to keep it
	verdictServe               // nobody can: served where it misses least
	verdictRefuse              // nobody can, and the SLO says refuse
)

// promiseState is what the promise stage knows and decided of a pick.
type promiseState struct {
	slo       predict.SLO
	objective time.Duration // the TTFT objective, from arrival
	remaining time.Duration // what was left of it at the pick
	// nowChance and waitChance are the predicted chances of keeping the
	// promise by binding now (the best worker's) and by waiting.
	nowChance, waitChance float64
	verdict               uint8
	wait                  time.Duration // verdictWait: the predicted first token after waiting
}

// promiseRecord puts the chosen worker's prediction and the stage's
// verdict in a record.
func promiseRecord(pm *promiseState, pr *predict.Prediction, trusted string) *decisions.Promise {
	out := &decisions.Promise{
		ObjectiveMs: millis(pm.objective), RemainingMs: millis(pm.remaining), MinDecode: pm.slo.MinDecode,
		OnMiss: string(pm.slo.OnMiss),
	}
	if pr != nil {
		out.PredictedTTFTMs, out.PredictedDecode, out.PredictedOthersDecode = millis(pr.TTFT), pr.Decode, pr.DecodeOthers
		out.Source, out.Known = pr.Source, pr.Known
	}
	out.Untrusted = trusted
	switch pm.verdict {
	case verdictMeets:
		out.Verdict = "meets"
	case verdictLimits:
		out.Verdict = "no prediction yet: judged by the learned limits"
	case verdictWait:
		out.Verdict = fmt.Sprintf("waits: the first token after a stream ends is predicted in %.0f ms, sooner than any worker now", millis(pm.wait))
	case verdictServe:
		out.Verdict = "no worker meets it, now or after waiting: served where the first token is predicted soonest"
	case verdictRefuse:
		out.Verdict = "no worker meets it, now or after waiting: refused (on_miss: refuse)"
	}
	return out
}

// millis is d in milliseconds, as records give times.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sloFilter only names the reason of the workers promiseStage dropped.
type sloFilter struct{}

func (sloFilter) keep(_ *pick, in []int32, _ uint8) []int32 { return in }
func (sloFilter) explain(*pickRecord, *slot) string {
	return "predicted to miss this request's SLO (its objective, or the decode floor of its stream or of those running there)"
}
