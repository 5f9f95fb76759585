package scheduler

import (
	"errors"
	"math"
	"time"

	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/promise"
)

// Admission by promise (Config.Admission "slo"; the judgment: package
// promise). The stage runs after the candidates (it needs their prefix
// match) and before the picker, dropping workers with the reason whySLO;
// baselines never run it.

// Admission modes (Config.Admission).
const (
	// AdmitByLimits judges workers by their learned concurrency limits.
	AdmitByLimits = "limits"
	// AdmitBySLO judges them by the predicted promise (package promise).
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

// promiseStage resolves p's SLO (d as sloOf says) and objective, asks the
// predictor about each eligible worker, and keeps those package promise
// judges may take the request; p.promise says what it decided.
func (p *pick) promiseStage(d *derived) {
	slo := p.sloOf(d)
	cached := 0
	for j := range p.cands {
		cached = max(cached, int(clamp01(p.cands[j].PrefixMatch)*float64(p.req.PromptTokens)))
	}
	// The objective allows for the prefill of what no worker is expected
	// to hold: the most cached anywhere is what it could skip.
	objective := slo.Deadline(p.req.PromptTokens, cached)
	if objective <= 0 {
		objective = math.MaxInt64 / 4 // no TTFT objective: any time meets it
	}
	predictor := p.conf.cfg.Predictor
	ws := make([]promise.Worker, len(p.elig))
	for j := range ws {
		v, c := p.at(j), &p.cands[j]
		pred := predictor.Predict(c.Name, p.inputFor(v, c))
		trusted, _ := predictor.Trusted(c.Name)
		ws[j] = promise.Worker{Pred: pred, Judged: pred.Known && trusted, UnderLimit: v.active < v.lim.limit}
	}
	p.promise = promise.Judge(ws, slo, objective, objective-p.env.Now.Sub(p.arrived))
	keep := 0
	for j := range ws {
		if ws[j].Keeps {
			p.elig[keep], p.cands[keep], ws[keep] = p.elig[j], p.cands[j], ws[j]
			keep++
			continue
		}
		p.at(j).why = whySLO
	}
	p.elig, p.cands, p.judged = p.elig[:keep], p.cands[:keep], ws[:keep]
}

// sloFilter only names the reason of the workers promiseStage dropped.
type sloFilter struct{}

func (sloFilter) keep(_ *pick, in []int32, _ uint8) []int32 { return in }
func (sloFilter) explain(*pickRecord, *slot) string {
	return "predicted to miss this request's SLO (its objective, or the decode floor of its stream or of those running there)"
}
