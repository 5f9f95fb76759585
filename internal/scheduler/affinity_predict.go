package scheduler

import (
	"fmt"

	"github.com/sluice-router/sluice/internal/decisions"
)

// Prefix affinity bounded by prediction (Config.PredictedAffinity).
//
// The prefix term weighs a cached prefix at half a request in flight, so
// that a popular prompt cannot herd onto one card; but the same weight
// sends a conversation's next turn away from the worker holding it as
// soon as that worker runs one request more than another, however much
// of the prompt it would not have to prefill. On the agent load
// (bench.Agent on the demo fleet, requests waiting for their answers)
// that is most of the next turns that move: at 50% load 619 of 955 moved
// lost to a worker running fewer requests, and in 820 the worker left
// behind still held the conversation (vsim's
// TestRun_AgentSessionsWhyTurnsMove; docs/routing.md, Agent sessions).
//
// So after the score has chosen, a candidate holding more of the prompt
// than the score's choice is weighed by what the predictor (package
// predict) says the two would cost, and wins when it costs less:
//
//	cost(w) = ttft(w) + others(w) × (stall(w) + out × Δ(w))
//
// ttft is the request's own predicted time to first token there (its
// uncached prefill at the worker's rate and load, and any wait inside
// it); stall the part of that which is its prefill, which the streams
// already running there wait through; Δ how much slower, per token, they
// decode with one stream more, over the request's expected output. A
// conversation goes back to its worker exactly when that is predicted to
// be faster for it and to cost the streams there less than the prefill
// it saves: herding is bounded by prediction, not by a weight.
//
// Bounds: both workers' predictions must be Known and trusted (else the
// score stands); the rule never takes a worker over its limit (it picks
// among the eligible); and it never sends a request where it would make
// that worker run two or more, over 1.5 (Config.AffinityHerd,
// admission.affinity_herd) × the mean of the model's healthy workers,
// while one of them runs nothing: the guarantee the prefix term's weight
// gave, kept as a bound of its own.
// That bound, not the prediction, is what still moves most turns off an
// eligible worker on the agent load (the same test).
//
// The rule runs after the picker, on its choice, and never with a
// shared Ledger (the ledger chooses across replicas) or a baseline.

// DefaultAffinityHerd is the no-herding bound of predicted affinity when
// Config.AffinityHerd is 0: a worker's load over the mean it may not be
// sent past while another worker idles.
const DefaultAffinityHerd = 1.5

// affinityChoice is what the rule decided when it overrode the score,
// for the record.
type affinityChoice struct {
	to, from         string  // the holder chosen, the score's choice
	toMatch, frMatch float64 // their prefix matches
	toSrc            string
	toCost, frCost   predictedCost
}

// predictedCost is one worker's side of the comparison, in ms.
type predictedCost struct {
	ttft, harm float64
	others     int
}

func (c predictedCost) total() float64 { return c.ttft + c.harm }

// predictedAffinityLocked applies the rule to p, whose picker chose
// cands[best]: it returns the candidate to bind, and when that is not
// best, what the record says of it.
func (s *Scheduler) predictedAffinityLocked(p *pick, best int) (int, *affinityChoice) {
	if !s.cfg.PredictedAffinity || s.cfg.Predictor == nil || p.baseline || p.shared || !s.prefixWeighted || len(p.cands) < 2 {
		return best, nil
	}
	b := &p.cands[best]
	var bc predictedCost
	known := false // bc is computed
	pick, pc := -1, predictedCost{}
	out := -1.0
	for j := range p.cands {
		c := &p.cands[j]
		if j == best || c.PrefixMatch <= b.PrefixMatch {
			continue
		}
		if !known {
			out, _ = s.est.estimate(&p.req)
			var ok bool
			if bc, ok = s.predictedCostLocked(p, best, out); !ok {
				return best, nil
			}
			known = true
		}
		cc, ok := s.predictedCostLocked(p, j, out)
		if !ok || cc.total() >= bc.total() || (pick >= 0 && cc.total() >= pc.total()) || s.wouldHerdLocked(p, j) {
			continue
		}
		pick, pc = j, cc
	}
	if pick < 0 {
		return best, nil
	}
	c := &p.cands[pick]
	return pick, &affinityChoice{to: c.Name, from: b.Name, toMatch: c.PrefixMatch, frMatch: b.PrefixMatch, toSrc: c.PrefixSource, toCost: pc, frCost: bc}
}

// predictedCostLocked is cost(w) above for candidate j, whose request
// is expected to produce out tokens; false when the worker's predictions
// are not to be used.
func (s *Scheduler) predictedCostLocked(p *pick, j int, out float64) (predictedCost, bool) {
	v, c := p.at(j), &p.cands[j]
	pr := s.cfg.Predictor
	if ok, _ := pr.Trusted(c.Name); !ok {
		return predictedCost{}, false
	}
	in := s.inputFor(p, v, c)
	in.OutputTokens = int(out + 0.5)
	now := pr.Predict(c.Name, in)
	if !now.Known {
		return predictedCost{}, false
	}
	cost := predictedCost{ttft: millis(now.TTFT), others: in.InFlight}
	if in.Slots > 0 {
		cost.others = min(cost.others, in.Slots-1)
	}
	if cost.others == 0 {
		return cost, true
	}
	// The prefill: the first token's time less that of the same request
	// with nothing to prefill (the wait inside the worker is in both).
	cached := in
	cached.CachedTokens = in.PromptTokens
	stall := max(millis(now.TTFT-pr.Predict(c.Name, cached).TTFT), 0)
	// One stream more: the rate at this level against the one below.
	slower := 0.0 // s per token
	if now.Decode > 0 {
		less := in
		less.InFlight--
		if r := pr.Predict(c.Name, less).Decode; r > 0 {
			slower = max(1/now.Decode-1/r, 0)
		}
	}
	cost.harm = float64(cost.others) * (stall + out*slower*1000)
	return cost, true
}

// wouldHerdLocked reports whether binding p's request to candidate j
// would make its worker run two or more, over Config.AffinityHerd × the
// mean of the model's healthy workers, while one of them runs nothing.
func (s *Scheduler) wouldHerdLocked(p *pick, j int) bool {
	bound := s.cfg.AffinityHerd
	switch {
	case bound < 0:
		return false
	case bound == 0:
		bound = DefaultAffinityHerd
	}
	target := p.at(j).w
	sum, n, idle := 1, 0, false
	for i := range p.views {
		v := &p.views[i]
		if !v.serving || v.why == whyDraining || v.why == whyDown || v.why == whyLoading {
			continue
		}
		f := v.w.inFlight()
		sum += f
		n++
		idle = idle || (f == 0 && v.w != target)
	}
	after := target.inFlight() + 1
	return idle && after >= 2 && n > 0 && float64(after) > bound*float64(sum)/float64(n)
}

// explain has rec say why the holder was chosen over the score's choice,
// and rank it first.
func (a *affinityChoice) explain(r *decisions.Record) {
	var to *decisions.Candidate
	for i := range r.Candidates {
		if c := &r.Candidates[i]; c.Worker == a.to {
			to = c
		}
	}
	if to != nil && to.Rank > 1 {
		for i := range r.Candidates {
			if c := &r.Candidates[i]; c.Rank > 0 && c.Rank < to.Rank {
				c.Rank++
			}
		}
		to.Rank = 1
	}
	r.Reason = fmt.Sprintf("prefix affinity by prediction: %s holds %.0f%% of the prompt (%s) against %.0f%% on %s, the lowest score; first token predicted in %.0f ms there against %.0f ms, and the %d stream(s) running there lose ~%.0f ms to it against ~%.0f ms for %d on %s",
		a.to, 100*a.toMatch, a.toSrc, 100*a.frMatch, a.from, a.toCost.ttft, a.frCost.ttft, a.toCost.others, a.toCost.harm, a.frCost.harm, a.frCost.others, a.from)
}
