package scheduler

import (
	"fmt"
	"math"
	"slices"

	"github.com/sluice-router/sluice/internal/hashring"
)

// DefaultHashLoadBound is consistent-hash's load bound when none is set,
// as in KubeAI's PrefixHash.
const DefaultHashLoadBound = 1.25

// consistentHash is consistent hashing with bounded loads (Mirrokni,
// Thorup and Zadimoghaddam) on the prompt's first block: the first
// eligible worker clockwise on the ring with fewer requests in flight than
// ceil(bound × (in flight + 1) / eligible workers) takes the request. It is
// the simple prefix-cache router (KubeAI's PrefixHash) Sluice is compared
// against. A request with no known prompt goes to the least busy worker.
type consistentHash struct {
	bound float64
	ring  hashring.Ring // of the workers, a member's index a view's
}

func (c *consistentHash) choose(p *pick, pr *pickRecord) int {
	if len(p.req.Prefix) == 0 {
		best := leastConnections{}.choose(p, nil)
		if pr != nil {
			pr.rec.Reason = fmt.Sprintf("no prompt to hash: fewest active requests (%d)", p.at(best).active)
		}
		return best
	}
	c.ring.Build(len(p.views), func(i int) string { return p.views[i].w.spec.Name })
	total := 0
	for j := range p.elig {
		total += p.at(j).active
	}
	// At least one eligible worker is under the bound: the mean load is
	// total/n, below (total+1)/n × bound for any bound ≥ 1.
	capacity := int(math.Ceil(c.bound * float64(total+1) / float64(len(p.elig))))
	skipped := 0
	for i := range c.ring.Walk(p.req.Prefix[0]) {
		j, ok := slices.BinarySearch(p.elig, int32(i)) // elig is in view order
		if !ok {
			continue
		}
		if p.at(j).active < capacity {
			if pr != nil {
				pr.rec.Reason = fmt.Sprintf("prompt's first block hashes here (%d workers at the load bound of %d passed over)", skipped, capacity)
			}
			return j
		}
		skipped++
	}
	return leastConnections{}.choose(p, pr) // not reached: see capacity
}
