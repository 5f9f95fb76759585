// Package promise judges admission by promise (docs/routing.md,
// Admission by promise): from what each eligible worker is predicted to
// give a request, whether the request binds now and where, waits for a
// stream to end, is served where it misses least, or is refused. A
// request's promise is its SLO: a first token within its objective and a
// decode rate no lower than its floor, for it and for the streams already
// running beside it.
package promise

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
)

// Verdict is what Judge decided of a request.
type Verdict uint8

// The verdicts; the zero Verdict says Judge did not run.
const (
	None   Verdict = iota
	Meets          // some worker is predicted to keep the promise
	Limits         // no worker is judged by prediction yet
	Wait           // waiting for a stream to end is predicted to keep it
	Serve          // nobody can: served where it misses least
	Refuse         // nobody can, and the SLO says refuse
)

// Worker is what Judge knows of one eligible worker.
type Worker struct {
	// Pred is what the request is predicted to get there now.
	Pred predict.Prediction
	// Judged says Pred is known and trusted; a worker not judged by
	// prediction is judged by its learned limit (UnderLimit).
	Judged, UnderLimit bool
	// Keeps is Judge's answer: the request may go there.
	Keeps bool
}

// Judgment is what Judge knew and decided of a request.
type Judgment struct {
	SLO       predict.SLO
	Objective time.Duration // the TTFT objective, from arrival
	Remaining time.Duration // what was left of it at the pick
	// NowChance and WaitChance are the predicted chances of keeping the
	// promise by binding now (the best worker's) and by waiting.
	NowChance, WaitChance float64
	Verdict               Verdict
	Wait                  time.Duration // Wait: the predicted first token after waiting
}

// SurelyKept is the chance of keeping its floor at which a request binds
// now whatever waiting might add: the share of requests that must keep
// their promise for a load to count as goodput. Closer chances than this
// are within the predictions' error, and waiting on them leaves slots idle.
const SurelyKept = 0.95

// Judge sets ws[j].Keeps for a request with remaining of its objective
// left. A decode floor is kept by most streams, not by the median one, so
// each worker's chance of keeping it, for the new stream and for those
// already running there, comes from the predicted rate and its spread
// (FloorChance). The request binds now unless waiting for the first stream
// to end (taken as memoryless, of mean FreeIn) is predicted likelier to
// keep every promise involved; a chance of SurelyKept binds at once.
func Judge(ws []Worker, slo predict.SLO, objective, remaining time.Duration) Judgment {
	jm := Judgment{SLO: slo, Objective: objective, Remaining: remaining}
	floor := slo.MinDecode
	bestWait := waitFor(ws, floor, &jm)
	bestNow := time.Duration(math.MaxInt64)
	any, judged := false, 0
	for j := range ws {
		w, pr := &ws[j], &ws[j].Pred
		if !w.Judged {
			w.Keeps = w.UnderLimit
			any = any || w.Keeps
			continue
		}
		judged++
		bestNow = min(bestNow, pr.TTFT)
		chance := FloorChance(pr.Decode, pr.DecodeCV, floor) * FloorChance(pr.DecodeOthers, pr.DecodeCV, floor)
		w.Keeps = pr.TTFT <= remaining && chance > 0
		if w.Keeps {
			any = true
			jm.NowChance = max(jm.NowChance, chance)
		}
	}
	if judged > 0 && jm.NowChance < SurelyKept && jm.NowChance < jm.WaitChance {
		// Waiting keeps the promise more surely than any worker now. A
		// worker judged by its limits has an unknown chance, taken as no
		// better: it is let go too, unless it has no prediction at all.
		for j := range ws {
			if ws[j].Pred.Known {
				ws[j].Keeps = false
			}
		}
		any = slices.ContainsFunc(ws, func(w Worker) bool { return w.Keeps })
	}
	switch {
	case any:
		jm.Verdict = Meets
	case judged == 0:
		jm.Verdict = Limits // nobody judged by prediction: wait as ever
	case jm.WaitChance > 0 || (bestWait <= remaining && bestWait < bestNow):
		jm.Verdict, jm.Wait = Wait, bestWait
	case slo.OnMiss == predict.OnMissRefuse:
		jm.Verdict = Refuse
	default:
		// Served where its first token is predicted soonest.
		jm.Verdict = Serve
		for j := range ws {
			ws[j].Keeps = ws[j].Pred.Known && ws[j].Pred.TTFT == bestNow
		}
	}
	return jm
}

// waitFor returns the soonest first token predicted after waiting for a
// stream to end on a judged worker, and sets jm.WaitChance to the best
// chance of keeping the promise by waiting.
func waitFor(ws []Worker, floor float64, jm *Judgment) time.Duration {
	bestWait := time.Duration(math.MaxInt64)
	for j := range ws {
		pr := &ws[j].Pred
		if !ws[j].Judged || pr.FreeIn <= 0 {
			continue
		}
		after := pr.FreeIn + pr.TTFTAfterOne
		bestWait = min(bestWait, after)
		if after <= jm.Remaining {
			inTime := 1 - math.Exp(-float64(jm.Remaining-pr.TTFTAfterOne)/float64(pr.FreeIn))
			jm.WaitChance = max(jm.WaitChance, inTime*
				FloorChance(pr.DecodeAfterOne, pr.DecodeCVAfterOne, floor)*
				FloorChance(pr.DecodeOthersAfterOne, pr.DecodeCVAfterOne, floor))
		}
	}
	return bestWait
}

// FloorChance is the chance that a stream predicted to decode at rate,
// with coefficient of variation cv at its level, keeps floor, its rate
// taken as log-normal about the prediction. 1 without a floor or a rate;
// 1 or 0 while no spread is known.
func FloorChance(rate, cv, floor float64) float64 {
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

// Record is the decision record's account of the judgment and of the
// chosen worker's prediction pr (nil: none); untrusted says why that
// worker's predictions are not trusted ("" when they are).
func (jm *Judgment) Record(pr *predict.Prediction, untrusted string) *decisions.Promise {
	out := &decisions.Promise{
		ObjectiveMs: millis(jm.Objective), RemainingMs: millis(jm.Remaining), MinDecode: jm.SLO.MinDecode,
		OnMiss: string(jm.SLO.OnMiss),
	}
	if pr != nil {
		out.PredictedTTFTMs, out.PredictedDecode, out.PredictedOthersDecode = millis(pr.TTFT), pr.Decode, pr.DecodeOthers
		out.Source, out.Known = pr.Source, pr.Known
	}
	out.Untrusted = untrusted
	switch jm.Verdict {
	case Meets:
		out.Verdict = "meets"
	case Limits:
		out.Verdict = "no prediction yet: judged by the learned limits"
	case Wait:
		out.Verdict = fmt.Sprintf("waits: the first token after a stream ends is predicted in %.0f ms, sooner than any worker now", millis(jm.Wait))
	case Serve:
		out.Verdict = "no worker meets it, now or after waiting: served where the first token is predicted soonest"
	case Refuse:
		out.Verdict = "no worker meets it, now or after waiting: refused (on_miss: refuse)"
	}
	return out
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
