package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// pickRecord is a decision record as a pick makes it. A pick keeps one
// slot of plain values per worker; the record's words, terms and limits
// are recomputed from them when it is first read (explain), since records
// are read rarely and picks are made for every request.
type pickRecord struct {
	rec   decisions.Record
	slots []slot // one per worker, in configuration order
	// total are the eligible workers' scores, in configuration order,
	// when scored: the picker's slice, which the pick hands over.
	total []float64

	// What the terms and limits are recomputed from.
	env    Env     // of the decision; env.Req is &req
	req    Request // the request, as placed
	terms  []WeightedTerm
	limits *limit.Config // the learning limits, nil when fixed or not scored
	floor  float64
	waited time.Duration

	chosen int  // slot of the chosen worker, -1 when none
	scored bool // the eligible workers were scored and one chosen
	// unscored says the pick was a refusal's: nobody was scored under the
	// lock, and the score is computed when the record is read.
	unscored bool
	shared   bool // the shared ledger chose: its choice ranks first
	pending  bool // the ledger has yet to choose (patchShared completes it)
	// adapter is the request's LoRA adapter as the pick saw it (nil
	// when it names none), for the adapter rule's words: a copy.
	adapter *adapterPick
}

// slot is what a record keeps of one worker: what its limit was computed
// from and, for an eligible worker, what it was scored on.
type slot struct {
	name        string
	snap        *snapshot.Snapshot
	st          *stats.WorkerStats
	jobCost     float64 // Candidate.JobCost as scored, or as the KV-fit rule read it
	prefixMatch float64 // Candidate.PrefixMatch as scored
	prefixSrc   string  // Candidate.PrefixSource as scored
	kvSeq       int64   // Candidate.KVSeq as scored
	prefix      float64 // limit.State.Prefix: one more stream for a cached prefix
	lastPick    uint64  // for the rank's tie-break
	limit       int32
	cap         int32
	active      int32 // Sluice's in-flight count (the record's Active)
	scored      int32 // the in-flight count as scored (the shared ledger's, when it answered)
	why         uint8
	source      limit.Source
	loadable    bool // it could load the request's adapter (adapter.go)
}

// newPickRecord starts the record of pick p, scored by its terms, with
// its limits; its header is the caller's (fillRecord).
func newPickRecord(p *pick) *pickRecord {
	pr := &pickRecord{req: p.req, terms: p.conf.terms, floor: p.floor, waited: p.waited, chosen: -1, adapter: p.adapter}
	pr.env = Env{Now: p.env.Now, StaleAfter: p.env.StaleAfter, Req: &pr.req}
	if p.learning {
		pr.limits = p.conf.limits
	}
	return pr
}

// keep writes every worker's slot of the record from p's views once the
// picker has chosen. It reports whether the record scored p's eligible
// workers, which then have it as their latest decision.
func (pr *pickRecord) keep(p *pick) (scoring bool) {
	pr.slots = make([]slot, len(p.views))
	if pr.scored {
		pr.total = p.total
	}
	scoring = pr.scored && !pr.pending
	j := 0 // p.elig[j] is the next eligible view: elig is in view order
	score := 0.0
	for i := range p.views {
		v := &p.views[i]
		pr.slots[i] = slot{name: v.w.spec.Name, snap: v.snap, st: v.st, jobCost: v.cost, prefix: v.lim.prefix, lastPick: v.lastPick,
			limit: int32(v.lim.limit), cap: int32(v.lim.cap), active: int32(v.active), why: v.why, source: v.lim.source, loadable: v.loadable}
		if j < len(p.elig) && int(p.elig[j]) == i {
			sl, c := &pr.slots[i], &p.cands[j]
			sl.jobCost, sl.prefixMatch, sl.prefixSrc, sl.kvSeq, sl.scored = c.JobCost, c.PrefixMatch, c.PrefixSource, c.KVSeq, int32(c.Active)
			if scoring && i == pr.chosen {
				score = p.total[j]
			}
			j++
		}
	}
	pr.rec.Summary = decisions.Summary{Candidates: len(p.views), Eligible: len(p.cands)}
	if scoring && pr.chosen >= 0 {
		pr.rec.Summary.Score = score
	}
	return scoring
}

// explain builds r's candidates from pr's slots; r is &pr.rec.
func (pr *pickRecord) explain(r *decisions.Record) {
	cs := make([]decisions.Candidate, len(pr.slots))
	var cands []Candidate // the eligible ones as scored
	var at []int          // their indexes in cs
	for i := range pr.slots {
		sl, c := &pr.slots[i], &cs[i]
		c.Worker, c.Active, c.Limit, c.Eligible = sl.name, int(sl.active), int(sl.limit), sl.why == whyEligible
		c.LimitSource = sl.source.String()
		if sl.why == whyEligible {
			j := len(cands)
			cands = append(cands, Candidate{Name: sl.name, Active: int(sl.scored), JobCost: sl.jobCost, Snap: sl.snap, Stats: sl.st,
				Belief: Belief{PrefixMatch: sl.prefixMatch, PrefixSource: sl.prefixSrc, KVSeq: sl.kvSeq}})
			at = append(at, i)
			if pr.scored {
				// Active as scored: with a Ledger, the count across replicas.
				c.Active, c.Total = int(sl.scored), pr.total[j]
			}
		} else {
			c.Why = filters[sl.why].explain(pr, sl)
		}
		if pr.limits != nil {
			// This replica's in-flight count, which the limit saw.
			in := limit.Input{Cap: int(sl.cap), Source: limit.Learned, Active: int(sl.active), Stats: sl.st,
				Floor: pr.floor, Waited: pr.waited, Now: pr.env.Now}
			in.Sat, in.SatVal = saturated(sl.snap, pr.env.Now, pr.env.StaleAfter)
			st := pr.limits.Of(in)
			if sl.prefix > 0 { // made one stream over by pick.affinityBorrow
				st.Limit, st.Prefix = int(sl.active)+1, sl.prefix
			}
			c.LimitReason = st.String()
		}
	}
	r.Candidates = cs
	switch {
	case pr.scored:
		pr.explainScores(r, cands, at, pr.total[:len(at)])
	case pr.unscored && len(cands) > 0:
		// A refusal's pick scored nobody: the score is the same computed
		// now, from the same values (terms are pure).
		tot := totals(pr.terms, &pr.env, cands)
		for j, i := range at {
			cs[i].Total = tot[j]
		}
		pr.explainScores(r, cands, at, tot)
	case pr.chosen >= 0: // a baseline policy's choice
		cs[pr.chosen].Rank = 1
	}
}

// explainScores fills in the terms, ranks and reason of the eligible
// candidates (cands, at indexes at in r.Candidates, with totals tot).
func (pr *pickRecord) explainScores(r *decisions.Record, cands []Candidate, at []int, tot []float64) {
	keys := make([]rankKey, len(at))
	won := -1 // with a Ledger, its choice: ties and shared limits were its
	for j, i := range at {
		keys[j] = rankKey{tot[j], pr.slots[i].lastPick, i}
		if pr.shared && i == pr.chosen {
			won = j
		}
	}
	for j, ts := range explain(pr.terms, &pr.env, cands) {
		r.Candidates[at[j]].Terms = ts
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case a == won:
			return -1
		case b == won:
			return 1
		case keys[a].less(keys[b]):
			return -1
		case keys[b].less(keys[a]):
			return 1
		}
		return 0
	})
	for rank, j := range order {
		r.Candidates[at[j]].Rank = rank + 1
	}
	first := keys[order[0]].total
	switch {
	case r.Chosen == "":
		// A refusal's record: the ranks say who would have gone first,
		// its reason why nobody did (refuseLocked).
	case len(order) == 1:
		r.Reason = fmt.Sprintf("only eligible worker (score %.2f)", first)
	case won >= 0 && keys[order[1]].total < first:
		c := &r.Candidates[at[order[1]]]
		r.Reason = fmt.Sprintf("lowest score %.2f with room across replicas; %s at %.2f is at its limit there (%d/%d)", first, cands[order[1]].Name, keys[order[1]].total, c.Active, c.Limit)
	case won >= 0 && keys[order[1]].total == first:
		r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked by any replica (the shared ledger's pick sequence), then the first listed, wins", first, cands[order[1]].Name)
	case keys[order[1]].total == first:
		r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked, then the first listed, wins", first, cands[order[1]].Name)
	default:
		r.Reason = fmt.Sprintf("lowest score %.2f (next: %s at %.2f)", first, cands[order[1]].Name, keys[order[1]].total)
	}
}

// fillRecord fills in a new record's header: its ID and what it says of
// the request, whose expected output is out, from src.
func (s *Scheduler) fillRecord(rec *decisions.Record, req *Request, now time.Time, out float64, src string) {
	var id [64]byte
	*rec = decisions.Record{
		ID:           string(strconv.AppendUint(append(append(id[:0], s.prefix...), '-'), s.ids.Add(1), 10)),
		Time:         now,
		Model:        req.Model,
		Policy:       string(s.cfg.Policy),
		Attempt:      req.Attempt,
		PromptTokens: req.PromptTokens,
		PromptSource: req.PromptSource,
		MaxTokens:    req.MaxTokens,
		Class:        req.Class,
		Tenant:       req.Tenant,
		Session:      sessionLabel(req),
	}
	s.stampShared(rec)
	rec.ExpectedOutputTokens, rec.EstimateSource = int(math.Round(out)), src
}
