// Package baseline holds the routing policies Sluice is benchmarked
// against: round-robin, least-connections, random, power of two choices
// and consistent hashing with bounded loads. Like nginx and HAProxy they
// neither queue nor respect concurrency limits; the scheduler filters the
// workers and asks a Picker to choose among the eligible ones.
package baseline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/sluice-router/sluice/internal/hashring"
)

// Workers is what a baseline reads of one pick. j numbers the eligible
// workers (at least one), i every worker in configuration order.
type Workers interface {
	// Len is the number of eligible workers.
	Len() int
	// Active is eligible worker j's requests in flight.
	Active(j int) int
	// LastPick orders eligible worker j's latest pick (0: never).
	LastPick(j int) uint64
	// Index is eligible worker j's i; it grows with j.
	Index(j int) int
	// All is the number of workers, eligible or not.
	All() int
	// Name names worker i.
	Name(i int) string
	// Key is the prompt's first block hash, ok false when unknown.
	Key() (key uint64, ok bool)
}

// A Picker chooses among the eligible workers: it returns j and, when
// why is set, the reason in words for the decision record. Its state is
// its caller's to guard.
type Picker interface {
	Choose(ws Workers, why bool) (int, string)
}

// RoundRobin takes the eligible workers in turn.
func RoundRobin() Picker { return &roundRobin{} }

// LeastConnections takes the worker with the fewest requests in flight,
// the least recently picked among ties (nginx's and HAProxy's least_conn).
func LeastConnections() Picker { return leastConnections{} }

// Random takes a worker at random, from a source seeded by seed.
func Random(seed uint64) Picker { return randomPicker{newRand(seed)} }

// PowerOfTwo takes the less busy of two workers drawn at random.
func PowerOfTwo(seed uint64) Picker { return powerOfTwo{newRand(seed)} }

// ConsistentHash is consistent hashing with bounded loads (Mirrokni,
// Thorup and Zadimoghaddam) on the prompt's first block, the simple
// prefix-cache router (KubeAI's PrefixHash): the first eligible worker
// clockwise on the ring with fewer requests in flight than
// ceil(bound × (in flight + 1) / eligible workers) takes the request. A
// request with no known prompt goes to the least busy worker. bound is 1
// or more.
func ConsistentHash(bound float64) Picker { return &consistentHash{bound: bound} }

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5eed)) }

type roundRobin struct{ n uint64 }

func (r *roundRobin) Choose(ws Workers, _ bool) (int, string) {
	best := int(r.n % uint64(ws.Len()))
	r.n++
	return best, "round-robin"
}

type leastConnections struct{}

func (leastConnections) Choose(ws Workers, why bool) (int, string) {
	best := 0
	for j := range ws.Len() {
		if a, b := ws.Active(j), ws.Active(best); a < b || (a == b && ws.LastPick(j) < ws.LastPick(best)) {
			best = j
		}
	}
	if !why {
		return best, ""
	}
	return best, fmt.Sprintf("fewest active requests (%d), least recently picked among ties", ws.Active(best))
}

type randomPicker struct{ rng *rand.Rand }

func (r randomPicker) Choose(ws Workers, _ bool) (int, string) {
	return r.rng.IntN(ws.Len()), "random"
}

type powerOfTwo struct{ rng *rand.Rand }

func (r powerOfTwo) Choose(ws Workers, why bool) (int, string) {
	n := ws.Len()
	a, b := r.rng.IntN(n), r.rng.IntN(n)
	if n > 1 {
		for b == a {
			b = r.rng.IntN(n)
		}
	}
	best := a
	if ws.Active(b) < ws.Active(a) {
		best = b
	}
	if !why {
		return best, ""
	}
	return best, fmt.Sprintf("fewer active of two random (%s, %s)", ws.Name(ws.Index(a)), ws.Name(ws.Index(b)))
}

type consistentHash struct {
	bound float64
	ring  hashring.Ring // of every worker: a member's index is its i
}

func (c *consistentHash) Choose(ws Workers, why bool) (int, string) {
	key, ok := ws.Key()
	if !ok {
		best, _ := leastConnections{}.Choose(ws, false)
		if !why {
			return best, ""
		}
		return best, fmt.Sprintf("no prompt to hash: fewest active requests (%d)", ws.Active(best))
	}
	c.ring.Build(ws.All(), ws.Name)
	n, total := ws.Len(), 0
	for j := range n {
		total += ws.Active(j)
	}
	// At least one eligible worker is under the bound: the mean load is
	// total/n, below (total+1)/n × bound for any bound ≥ 1.
	capacity := int(math.Ceil(c.bound * float64(total+1) / float64(n)))
	skipped := 0
	for i := range c.ring.Walk(key) {
		j := sort.Search(n, func(j int) bool { return ws.Index(j) >= i })
		if j == n || ws.Index(j) != i {
			continue // not eligible
		}
		if ws.Active(j) >= capacity {
			skipped++
			continue
		}
		if !why {
			return j, ""
		}
		return j, fmt.Sprintf("prompt's first block hashes here (%d workers at the load bound of %d passed over)", skipped, capacity)
	}
	return leastConnections{}.Choose(ws, why) // not reached: see capacity
}
