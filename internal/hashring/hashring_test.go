package hashring

import (
	"fmt"
	"testing"
)

// first is the member a key goes to when every member may take it.
func first(r *Ring, key uint64) int {
	for m := range r.Walk(key) {
		return m
	}
	return -1
}

// Keys spread over the members, and when a member leaves only its keys
// move: every other key stays with its member.
func TestRing_SpreadsAndKeepsKeysWhenAMemberLeaves(t *testing.T) {
	names := []string{"w0", "w1", "w2", "w3"}
	var r Ring
	r.Build(len(names), func(i int) string { return names[i] })
	const keys = 4000
	before := make([]string, keys)
	count := map[string]int{}
	for k := range keys {
		before[k] = names[first(&r, uint64(k))]
		count[before[k]]++
	}
	for _, n := range names {
		if c := count[n]; c < keys/len(names)/2 || c > keys/len(names)*2 {
			t.Fatalf("%s got %d of %d keys: %v", n, c, keys, count)
		}
	}
	left := []string{"w0", "w1", "w3"} // w2 leaves
	r.Build(len(left), func(i int) string { return left[i] })
	for k := range keys {
		after := left[first(&r, uint64(k))]
		if before[k] != "w2" && after != before[k] {
			t.Fatalf("key %d moved from %s to %s though its member stayed", k, before[k], after)
		}
	}
}

// Walk visits every point: each member as often as it has points.
func TestRing_WalkVisitsEveryPoint(t *testing.T) {
	var r Ring
	if first(&r, 1) != -1 {
		t.Fatal("an empty ring yielded a member")
	}
	r.Build(3, func(i int) string { return fmt.Sprint("m", i) })
	seen := map[int]int{}
	for m := range r.Walk(42) {
		seen[m]++
	}
	for m := range 3 {
		if seen[m] != replicas {
			t.Fatalf("member %d visited %d times, want %d: %v", m, seen[m], replicas, seen)
		}
	}
}
