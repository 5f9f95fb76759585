package scheduler

import (
	"fmt"
	"math/rand/v2"
)

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
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	switch policy {
	case PolicyRoundRobin:
		return &roundRobin{}
	case PolicyLeastConnections:
		return leastConnections{}
	case PolicyRandom:
		return randomPicker{rng}
	case PolicyPowerOfTwo:
		return powerOfTwo{rng}
	case PolicyConsistentHash:
		return &consistentHash{bound: bound}
	}
	return &scorePicker{terms: terms}
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

// roundRobin takes the eligible workers in turn.
type roundRobin struct{ n uint64 }

func (r *roundRobin) choose(p *pick, pr *pickRecord) int {
	best := int(r.n % uint64(len(p.elig)))
	r.n++
	if pr != nil {
		pr.rec.Reason = "round-robin"
	}
	return best
}

// leastConnections takes the worker with the fewest requests in flight,
// the least recently picked among ties (nginx's and HAProxy's least_conn).
type leastConnections struct{}

func (leastConnections) choose(p *pick, pr *pickRecord) int {
	best := 0
	for i := range p.elig {
		v, b := p.at(i), p.at(best)
		if v.active < b.active || (v.active == b.active && v.lastPick < b.lastPick) {
			best = i
		}
	}
	if pr != nil {
		pr.rec.Reason = fmt.Sprintf("fewest active requests (%d), least recently picked among ties", p.at(best).active)
	}
	return best
}

// randomPicker takes a worker at random.
type randomPicker struct{ rng *rand.Rand }

func (r randomPicker) choose(p *pick, pr *pickRecord) int {
	best := r.rng.IntN(len(p.elig))
	if pr != nil {
		pr.rec.Reason = "random"
	}
	return best
}

// powerOfTwo takes the less busy of two workers drawn at random.
type powerOfTwo struct{ rng *rand.Rand }

func (r powerOfTwo) choose(p *pick, pr *pickRecord) int {
	n := len(p.elig)
	a, b := r.rng.IntN(n), r.rng.IntN(n)
	if n > 1 {
		for b == a {
			b = r.rng.IntN(n)
		}
	}
	best := a
	if p.at(b).active < p.at(a).active {
		best = b
	}
	if pr != nil {
		pr.rec.Reason = fmt.Sprintf("fewer active of two random (%s, %s)", p.at(a).w.spec.Name, p.at(b).w.spec.Name)
	}
	return best
}
