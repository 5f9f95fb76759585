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
