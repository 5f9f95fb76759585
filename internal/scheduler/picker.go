package scheduler

import "github.com/sluice-router/sluice/internal/baseline"

// Policy selects how a worker is chosen. PolicySluice scores and queues;
// the others are common baselines, built in so a benchmark compares
// policies and nothing else. Baselines neither queue nor respect limits.
type Policy string

// The routing policies.
const (
	PolicySluice           Policy = "sluice"
	PolicyRoundRobin       Policy = "round-robin"
	PolicyLeastConnections Policy = "least-connections"
	PolicyRandom           Policy = "random"
	PolicyPowerOfTwo       Policy = "p2c"
	PolicyConsistentHash   Policy = "consistent-hash"
)

// Policies lists every policy, Sluice's first.
var Policies = []Policy{PolicySluice, PolicyRoundRobin, PolicyLeastConnections, PolicyRandom, PolicyPowerOfTwo, PolicyConsistentHash}

// A picker is a policy's choice among a pick's eligible workers (at
// least one): choose returns the index in p.elig and, when pr is not nil,
// says why in pr. Its state is under the scheduler's lock.
type picker interface {
	choose(p *pick, pr *pickRecord) int
}

// newPicker returns the picker of a policy; the random ones are seeded by
// seed, so a benchmark's baselines are reproducible.
func newPicker(policy Policy, terms []WeightedTerm, seed uint64, bound float64) picker {
	switch policy {
	case PolicyRoundRobin:
		return baselinePicker{baseline.RoundRobin()}
	case PolicyLeastConnections:
		return baselinePicker{baseline.LeastConnections()}
	case PolicyRandom:
		return baselinePicker{baseline.Random(seed)}
	case PolicyPowerOfTwo:
		return baselinePicker{baseline.PowerOfTwo(seed)}
	case PolicyConsistentHash:
		return baselinePicker{baseline.ConsistentHash(bound)}
	}
	return &scorePicker{terms: terms}
}

// DefaultHashLoadBound is consistent-hash's load bound when none is set,
// as in KubeAI's PrefixHash.
const DefaultHashLoadBound = 1.25

// baselinePicker is a baseline policy's choice (package baseline).
type baselinePicker struct{ b baseline.Picker }

func (bp baselinePicker) choose(p *pick, pr *pickRecord) int {
	best, why := bp.b.Choose((*baselineView)(p), pr != nil)
	if pr != nil {
		pr.rec.Reason = why
	}
	return best
}

// baselineView is what a baseline reads of a pick.
type baselineView pick

func (b *baselineView) Len() int              { return len(b.elig) }
func (b *baselineView) Active(j int) int      { return b.views[b.elig[j]].active }
func (b *baselineView) LastPick(j int) uint64 { return b.views[b.elig[j]].lastPick }
func (b *baselineView) Index(j int) int       { return int(b.elig[j]) }
func (b *baselineView) All() int              { return len(b.views) }
func (b *baselineView) Name(i int) string     { return b.views[i].w.spec.Name }
func (b *baselineView) Key() (uint64, bool) {
	if len(b.req.Prefix) == 0 {
		return 0, false
	}
	return b.req.Prefix[0], true
}

// scorePicker is Sluice's policy: the lowest weighted sum of the terms
// wins, ties broken by rankKey. The totals are left in p.total for the
// record and the shared ledger.
type scorePicker struct {
	terms []WeightedTerm
}

func (sp *scorePicker) choose(p *pick, pr *pickRecord) int {
	tot := totals(sp.terms, &p.env, p.cands)
	p.total = tot
	best := 0
	// A view's index is its worker's order (configuration order).
	bk := rankKey{tot[0], p.at(0).lastPick, int(p.elig[0])}
	for i := 1; i < len(p.cands); i++ { // one pass: only the winner is needed now
		if k := (rankKey{tot[i], p.at(i).lastPick, int(p.elig[i])}); k.less(bk) {
			best, bk = i, k
		}
	}
	if pr != nil {
		pr.scored = true
	}
	return best
}

// rankKey orders candidates: lowest total, then least recently picked,
// then first in configuration order, so the pick is deterministic.
type rankKey struct {
	total    float64
	lastPick uint64
	order    int
}

func (k rankKey) less(o rankKey) bool {
	switch {
	case k.total != o.total:
		return k.total < o.total
	case k.lastPick != o.lastPick:
		return k.lastPick < o.lastPick
	}
	return k.order < o.order
}
