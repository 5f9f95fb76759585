package prefix

import "testing"

func TestIndex_SetCapacity(t *testing.T) {
	x := NewIndex(Options{Capacity: 8, WorkerCapacity: map[string]int{"pinned": 3}})
	conv := make([]uint64, 8)
	for i := range conv {
		conv[i] = uint64(i + 1)
	}
	for _, w := range []string{"a", "b", "pinned"} {
		x.Record("m", conv, w)
		x.Record("n", conv[:4], w)
	}

	// a reports a KV cache of 2 blocks and a bit: both models shrink to
	// 2 blocks, the least recent (the last of the prompt) forgotten.
	x.SetCapacity("a", 2*BlockTokens+100)
	if got := x.Capacity("a"); got != 2 {
		t.Errorf("Capacity(a) = %d, want 2", got)
	}
	for _, model := range []string{"m", "n"} {
		if got := x.Len(model, "a"); got != 2 {
			t.Errorf("Len(%s, a) = %d after shrinking to 2", model, got)
		}
		if got := match(x, model, conv[:4], "a"); got != 0.5 {
			t.Errorf("Match(%s, a) = %v, want 0.5: the first two blocks stay", model, got)
		}
	}
	// The slab stays consistent: new blocks push the oldest out.
	x.Record("m", []uint64{100, 101, 102}, "a")
	if got := x.Len("m", "a"); got != 2 {
		t.Errorf("Len(m, a) = %d after recording 3 more blocks, want 2", got)
	}
	if got := match(x, "m", []uint64{100, 101}, "a"); got != 1 {
		t.Errorf("Match of the new blocks = %v, want 1", got)
	}

	// b reports a bigger cache: it remembers more than the default.
	x.SetCapacity("b", 20*BlockTokens)
	long := make([]uint64, 20)
	for i := range long {
		long[i] = uint64(1000 + i)
	}
	x.Record("m", long, "b")
	if got := x.Len("m", "b"); got != 20 {
		t.Errorf("Len(m, b) = %d, want 20 after growing to 20", got)
	}

	// A worker the operator sized keeps its size; nothing reported changes nothing.
	x.SetCapacity("pinned", 100*BlockTokens)
	x.SetCapacity("a", 0)
	if got := x.Capacity("pinned"); got != 3 {
		t.Errorf("Capacity(pinned) = %d, want the configured 3", got)
	}
	if got := x.Capacity("a"); got != 2 {
		t.Errorf("Capacity(a) = %d after SetCapacity(a, 0), want 2 still", got)
	}
	// A tiny cache still remembers one block; Forget drops the reported size.
	x.SetCapacity("a", 10)
	if got := x.Len("m", "a"); got != 1 {
		t.Errorf("Len(m, a) = %d with a 10-token cache, want 1", got)
	}
	x.Forget("a")
	if got := x.Capacity("a"); got != 8 {
		t.Errorf("Capacity(a) = %d after Forget, want the default 8", got)
	}
}

// blocks returns n block hashes from first on.
func blocks(first uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = first + uint64(i)
	}
	return h
}

// A worker that finds fewer blocks than expected is believed to hold less:
// its oldest blocks are forgotten with the ones it missed, the request's
// own blocks stay held, and reports that meet the guess grow the capacity
// back to the worker's size, not beyond.
func TestIndex_Correct(t *testing.T) {
	x := NewIndex(Options{Capacity: 12})
	a, b, c := blocks(100, 4), blocks(200, 4), blocks(300, 4)
	for _, p := range [][]uint64{a, b, c} { // a is the least recent
		x.Record("m", p, "w")
	}
	x.Record("m", a, "v")
	// c was believed held in full (4 blocks) and w found 1: it evicted 3
	// blocks the index still holds, and with them what is older.
	x.Correct("m", "w", c, 4, 1)
	if got := x.Capacity("w"); got != 9 {
		t.Errorf("Capacity(w) = %d after missing 3 blocks, want 9", got)
	}
	if got := match(x, "m", c, "w"); got != 1 {
		t.Errorf("Match(c) = %v, want 1: it was prefilled, so it is held", got)
	}
	if got := match(x, "m", a, "w"); got != 0.25 {
		t.Errorf("Match(a) = %v, want 0.25: the oldest blocks are forgotten", got)
	}
	if got := match(x, "m", b, "w"); got != 1 {
		t.Errorf("Match(b) = %v, want 1", got)
	}
	if got := x.Capacity("v"); got != 12 {
		t.Errorf("Capacity(v) = %d: another worker's report changed it", got)
	}
	// The capacity never falls below the request's own blocks.
	x.Correct("m", "w", c, 4, 0)
	x.Correct("m", "w", c, 4, 0)
	x.Correct("m", "w", c, 4, 0)
	if got := x.Capacity("w"); got != 4 {
		t.Errorf("Capacity(w) = %d after many misses, want the request's 4 blocks", got)
	}
	if got := match(x, "m", c, "w"); got != 1 {
		t.Errorf("Match(c) = %v after many misses, want 1", got)
	}
	// A right guess grows it by one, more found than expected by the
	// blocks beyond the guess, up to the worker's size.
	x.Correct("m", "w", c, 4, 4)
	if got := x.Capacity("w"); got != 5 {
		t.Errorf("Capacity(w) = %d after a right guess, want 5", got)
	}
	x.Correct("m", "w", c, 1, 4)
	if got := x.Capacity("w"); got != 8 {
		t.Errorf("Capacity(w) = %d after finding 3 more than expected, want 8", got)
	}
	x.Correct("m", "w", c, 0, 40)
	if got := x.Capacity("w"); got != 12 {
		t.Errorf("Capacity(w) = %d, want the worker's size, 12", got)
	}
	// A request expected and found uncached says nothing.
	x.Correct("m", "w", c, 4, 0)
	x.Correct("m", "w", c, 0, 0)
	if got := x.Capacity("w"); got != 8 {
		t.Errorf("Capacity(w) = %d, want 8", got)
	}
	// A reported size below the learned one bounds it; Forget drops both.
	x.SetCapacity("w", 6*BlockTokens)
	if got := x.Capacity("w"); got != 6 {
		t.Errorf("Capacity(w) = %d after a smaller reported size, want 6", got)
	}
	x.Forget("w")
	if got := x.Capacity("w"); got != 12 {
		t.Errorf("Capacity(w) = %d after Forget, want the default 12", got)
	}
}
