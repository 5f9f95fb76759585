package scheduler

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/predict"
)

// Admission by promise (Config.Admission "slo"): a request's promise is
// its SLO, a first token within its objective, then a decode rate no
// lower than its floor, and the scheduler admits to keep as many
// promises as it can. With a Predictor (package predict), each eligible
// worker is asked what the request would get there if sent now: its time
// to first token, its decode rate, and the decode rate left to the
// streams already running there.
//
//   - Bind now, to the best-scored worker among those predicted to meet
//     the request's objective (what is left of it after its wait in
//     Sluice) without pushing it or a running stream below the floor.
//   - If none is, wait in Sluice's queue only if waiting for the first
//     stream to end is predicted to meet the objective, and sooner than
//     any worker could now.
//   - When neither can, do what the SLO says: serve where the predicted
//     first token comes soonest (on_miss: serve), or refuse at once with
//     503 and Retry-After (on_miss: refuse), which under overload keeps
//     the workers for the requests that can still be served in time.
//
// A cached prefix shortens the predicted prefill, so a conversation goes
// back to its worker exactly when that is predicted to be faster for it
// and harmless to the streams there: herding is bounded by prediction.
// The learned limits become an input rather than a cap: a worker whose
// predictions are known and trusted is judged by them up to its cap (its
// max_concurrency or reported slots); one without enough history, or
// whose predictions keep missing (predict.Predictor.Trusted), is judged
// by its learned limit as under the "limits" admission, and the record
// says so.
//
// The stage runs after the candidates are known (it needs their prefix
// match) and before the picker; it drops workers with the reason code
// whySLO. Baselines never run it.

// Admission modes (Config.Admission).
const (
	// AdmitByLimits judges workers by their learned concurrency limits.
	AdmitByLimits = "limits"
	// AdmitBySLO judges them by the predicted promise (above).
	AdmitBySLO = "slo"
)

// ErrSLOUnmeetable is the refusal of a request no worker is predicted to
// serve within its SLO, now or after waiting, whose SLO says on_miss:
// refuse.
var ErrSLOUnmeetable = errors.New("no worker is predicted to meet this request's SLO, now or after waiting")

// promiseOn reports whether the promise stage runs for p.
func (s *Scheduler) promiseOn(p *pick) bool {
	return s.cfg.Predictor != nil && s.cfg.Admission == AdmitBySLO && !p.baseline
}

// sloOf resolves the SLO of a request: its own fields (an API key's,
// tightened by headers), then its class's, then the default: configured,
// else derived from what the model's workers do unloaded
// (predict.DefaultSLO), refreshed every sloRefresh.
func (s *Scheduler) sloOfLocked(req *Request, now time.Time) predict.SLO {
	slo := req.SLO
	if c, ok := s.cfg.SLOs[req.Class]; ok {
		slo = slo.Or(c)
	}
	if s.cfg.DefaultSLO != (predict.SLO{}) {
		return slo.Or(s.cfg.DefaultSLO)
	}
	d := s.derivedSLO[req.Model]
	if d == nil || now.Sub(d.at) >= sloRefresh {
		var fleet []predict.Unloaded
		if s.cfg.Predictor != nil {
			for _, w := range s.workers {
				if !w.serves(w.snapshot(), req.Model) {
					continue
				}
				if u, ok := s.cfg.Predictor.Unloaded(w.spec.Name); ok {
					fleet = append(fleet, u)
				}
			}
		}
		d = &derived{slo: predict.DefaultSLO(fleet), at: now}
		s.derivedSLO[req.Model] = d
	}
	return slo.Or(d.slo)
}

// derived is a model's default SLO as last derived.
type derived struct {
	slo predict.SLO
	at  time.Time
}

// sloRefresh is how often a model's derived default SLO is derived again.
const sloRefresh = 10 * time.Second

// startPromiseLocked resolves p's SLO, its objective and its expected
// output for the promise stage.
func (s *Scheduler) startPromiseLocked(p *pick) {
	pm := &p.promise
	pm.slo = s.sloOfLocked(&p.req, p.env.Now)
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
}

// inputFor describes p's request on the worker of candidate c.
func (s *Scheduler) inputFor(p *pick, v *view, c *Candidate) predict.Input {
	if p.out == 0 {
		p.out, _ = s.est.estimate(&p.req)
	}
	return predict.Input{
		PromptTokens: p.req.PromptTokens,
		CachedTokens: int(math.Round(clamp01(c.PrefixMatch) * float64(p.req.PromptTokens))),
		OutputTokens: int(math.Round(p.out)),
		InFlight:     v.w.inFlight(),
		Slots:        v.snap.Slots,
		Queue:        int(max(v.snap.QueueLen.Value, 0)),
	}
}

// promiseLocked is the promise stage: it keeps the workers predicted to
// keep p's promise, or decides that the request waits, is served where
// it misses least, or is refused.
func (s *Scheduler) promiseLocked(p *pick) {
	pm := &p.promise
	remaining := pm.objective - p.env.Now.Sub(p.arrived)
	n := len(p.elig)
	if cap(p.preds) < n {
		p.preds = make([]predict.Prediction, n)
		p.meets = make([]bool, n)
	}
	preds, meets := p.preds[:n], p.meets[:n]
	any, judged := false, 0
	bestNow, bestWait := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	for j := range n {
		v, c := p.at(j), &p.cands[j]
		preds[j] = s.cfg.Predictor.Predict(c.Name, s.inputFor(p, v, c))
		pr := &preds[j]
		if ok, _ := s.cfg.Predictor.Trusted(c.Name); !pr.Known || !ok {
			meets[j] = v.w.active < v.lim.limit // judged as by the limits
			any = any || meets[j]
			continue
		}
		judged++
		decodeOK := (pr.Decode == 0 || pr.Decode >= pm.slo.MinDecode) && (pr.DecodeOthers == 0 || pr.DecodeOthers >= pm.slo.MinDecode)
		meets[j] = pr.TTFT <= remaining && decodeOK
		any = any || meets[j]
		bestNow = min(bestNow, pr.TTFT)
		if pr.FreeIn > 0 {
			bestWait = min(bestWait, pr.FreeIn+pr.TTFTAfterOne)
		}
	}
	switch {
	case any:
		pm.verdict = verdictMeets
	case judged == 0:
		pm.verdict = verdictLimits // nobody judged by prediction: wait as ever
	case bestWait <= remaining && bestWait < bestNow:
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
	pm.remaining = remaining
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
	verdict   uint8
	wait      time.Duration // verdictWait: the predicted first token after waiting
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

// sloFilter only names the reason of the workers the promise stage
// dropped; the stage itself is promiseLocked (it compacts the
// candidates and predictions with the views).
type sloFilter struct{}

func (sloFilter) keep(_ *pick, in []int32, _ uint8) []int32 { return in }
func (sloFilter) explain(*pickRecord, *slot, *slotRefs) string {
	return "predicted to miss this request's SLO (its objective, or the decode floor of its stream or of those running there)"
}
