package baseline

import (
	"slices"
	"testing"
)

// fleet is a hand-made pick: every worker's name and load, and which are
// eligible.
type fleet struct {
	names    []string
	active   []int
	lastPick []uint64
	elig     []int
	key      uint64
	hasKey   bool
}

func (f *fleet) Len() int              { return len(f.elig) }
func (f *fleet) Active(j int) int      { return f.active[f.elig[j]] }
func (f *fleet) LastPick(j int) uint64 { return f.lastPick[f.elig[j]] }
func (f *fleet) Index(j int) int       { return f.elig[j] }
func (f *fleet) All() int              { return len(f.names) }
func (f *fleet) Name(i int) string     { return f.names[i] }
func (f *fleet) Key() (uint64, bool)   { return f.key, f.hasKey }

func TestLeastConnections_FewestThenLeastRecentlyPicked(t *testing.T) {
	f := &fleet{names: []string{"a", "b", "c"}, active: []int{1, 0, 0}, lastPick: []uint64{0, 7, 3}, elig: []int{0, 1, 2}}
	if j, why := LeastConnections().Choose(f, true); j != 2 || why == "" {
		t.Fatalf("chose %d (%q), want 2: as idle as b and picked longer ago", j, why)
	}
}

func TestRoundRobin_TakesEachInTurn(t *testing.T) {
	f := &fleet{names: []string{"a", "b", "c"}, active: make([]int, 3), lastPick: make([]uint64, 3), elig: []int{0, 2}}
	rr := RoundRobin()
	var got []int
	for range 4 {
		j, _ := rr.Choose(f, false)
		got = append(got, j)
	}
	if want := []int{0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("chose %v, want %v", got, want)
	}
}

// A key stays on its worker until that worker reaches the load bound,
// then goes on along the ring; ineligible workers are passed over.
func TestConsistentHash_BoundAndEligibility(t *testing.T) {
	f := &fleet{names: []string{"w0", "w1", "w2", "w3"}, active: make([]int, 4), lastPick: make([]uint64, 4), elig: []int{0, 1, 2, 3}, key: 42, hasKey: true}
	ch := ConsistentHash(1.25)
	first, _ := ch.Choose(f, false)
	f.active[f.elig[first]] = 5 // far above ceil(1.25 × 6 / 4) = 2
	next, why := ch.Choose(f, true)
	if next == first || why == "" {
		t.Fatalf("with the holder above the bound, chose %d again (%q)", next, why)
	}
	gone := f.Index(next)
	f.elig = slices.DeleteFunc(f.elig, func(i int) bool { return i == gone })
	if j, _ := ch.Choose(f, false); f.Index(j) == gone {
		t.Fatalf("chose worker %d, which is not eligible", gone)
	}
}
