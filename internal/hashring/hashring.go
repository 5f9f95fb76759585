// Package hashring is a consistent-hashing ring of named members: each
// member has many points on a ring of 64-bit values, placed by a hash of
// its name, and a key is walked clockwise from its own point. A member
// keeps its points when others come or go, so keys move only to or from
// the member that changed. A Ring is a plain value its owner guards.
package hashring

import (
	"hash/fnv"
	"iter"
	"slices"
	"strconv"
)

// replicas is how many points each member has on the ring, so that keys
// spread evenly over a few members.
const replicas = 256

// Ring is the ring of some members, in the order they were given. The
// zero value has none.
type Ring struct {
	names  []string // the members it was built from, in order
	points []point  // sorted by at, then member
}

// point is one of a member's points; member is its index in the order
// the members were given.
type point struct {
	at     uint64
	member int32
}

// Build lays the ring out for n members, member i named name(i), unless
// those are the members it has already.
func (r *Ring) Build(n int, name func(i int) string) {
	same := n == len(r.names)
	for i := 0; same && i < n; i++ {
		same = name(i) == r.names[i]
	}
	if same {
		return
	}
	r.names = r.names[:0]
	r.points = r.points[:0]
	for i := range n {
		nm := name(i)
		r.names = append(r.names, nm)
		for k := range replicas {
			h := fnv.New64a()
			h.Write([]byte(nm))
			h.Write([]byte{'#'})
			h.Write(strconv.AppendInt(nil, int64(k), 10))
			r.points = append(r.points, point{at: mix64(h.Sum64()), member: int32(i)})
		}
	}
	slices.SortFunc(r.points, func(a, b point) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return int(a.member - b.member)
	})
}

// Walk yields the member of every point of the ring, clockwise from
// key's point: each member once per point it has.
func (r *Ring) Walk(key uint64) iter.Seq[int] {
	return func(yield func(int) bool) {
		if len(r.points) == 0 {
			return
		}
		at := mix64(key)
		start, _ := slices.BinarySearchFunc(r.points, at, func(p point, k uint64) int {
			switch {
			case p.at < k:
				return -1
			case p.at > k:
				return 1
			}
			return 0
		})
		for k := range r.points {
			if !yield(int(r.points[(start+k)%len(r.points)].member)) {
				return
			}
		}
	}
}

// mix64 spreads a hash over the ring (splitmix64's finaliser): keys from a
// trace or a weak hash land evenly.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
