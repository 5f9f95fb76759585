package scheduler

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
)

// DefaultHashLoadBound is consistent-hash's load bound when none is set:
// a worker takes a request only while its requests in flight are under
// 1.25 times the fleet's mean (counting the new one), the default of
// KubeAI's PrefixHash.
const DefaultHashLoadBound = 1.25

// hashReplicas is how many points each worker has on the ring, so that
// keys spread evenly over a few workers.
const hashReplicas = 256

// consistentHash is consistent hashing with bounded loads (Mirrokni,
// Thorup and Zadimoghaddam) on the prompt's first block: a request goes
// to the first worker clockwise from its key's point on a ring of the
// workers' points that is eligible and has fewer requests in flight than
// ceil(bound × (in flight + 1) / eligible workers). Requests that share
// their first block go to the same worker until it is that much busier
// than the mean, then to the next worker on the ring: the simple
// prefix-cache router (KubeAI's PrefixHash) that Sluice's placement is
// compared against. A request with no known prompt goes to the worker
// with the fewest requests in flight. Like the other baselines it neither
// queues nor respects limits.
type consistentHash struct {
	bound float64
	names []string    // the workers the ring was built from, in order
	ring  []ringPoint // sorted by point
}

// ringPoint is one of a worker's points on the ring; order is its index
// in the scheduler's worker list (a view's index).
type ringPoint struct {
	at    uint64
	order int32
}

func (c *consistentHash) choose(p *pick, pr *pickRecord) int {
	if len(p.req.Prefix) == 0 {
		best := leastConnections{}.choose(p, nil)
		if pr != nil {
			pr.rec.Reason = fmt.Sprintf("no prompt to hash: fewest active requests (%d)", p.at(best).active)
		}
		return best
	}
	c.build(p.views)
	total := 0
	for j := range p.elig {
		total += p.at(j).active
	}
	// At least one eligible worker is under the bound: the mean load is
	// total/n, below (total+1)/n × bound for any bound ≥ 1.
	capacity := int(math.Ceil(c.bound * float64(total+1) / float64(len(p.elig))))
	key := mix64(p.req.Prefix[0])
	start, _ := slices.BinarySearchFunc(c.ring, key, func(r ringPoint, k uint64) int {
		switch {
		case r.at < k:
			return -1
		case r.at > k:
			return 1
		}
		return 0
	})
	skipped := 0
	for k := range c.ring {
		pt := c.ring[(start+k)%len(c.ring)]
		j, ok := slices.BinarySearch(p.elig, pt.order) // elig is in view order
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

// build lays the ring out for the workers of views when they changed.
func (c *consistentHash) build(views []view) {
	same := len(views) == len(c.names)
	for i := 0; same && i < len(views); i++ {
		same = views[i].w.spec.Name == c.names[i]
	}
	if same {
		return
	}
	c.names = c.names[:0]
	c.ring = c.ring[:0]
	for i := range views {
		name := views[i].w.spec.Name
		c.names = append(c.names, name)
		for r := range hashReplicas {
			h := fnv.New64a()
			h.Write([]byte(name))
			h.Write([]byte{'#'})
			h.Write(strconv.AppendInt(nil, int64(r), 10))
			c.ring = append(c.ring, ringPoint{at: mix64(h.Sum64()), order: int32(i)})
		}
	}
	slices.SortFunc(c.ring, func(a, b ringPoint) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return int(a.order - b.order)
	})
}

// mix64 spreads a hash over the ring (splitmix64's finaliser): prefix
// hashes from a trace or a weak hash land evenly.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
