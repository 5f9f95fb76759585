package stats

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// With shares every block it does not change, leaves the old value as it
// was, and reads levels it skipped over as zero.
func TestLevels_WithKeepsTheOldValue(t *testing.T) {
	set := func(v float64) func(*Level) {
		return func(l *Level) { l.DecodeTPS = EMA{Value: v, N: 1} }
	}
	a := Levels{}.With(1, set(10))
	b := a.With(40, set(40)) // three blocks, the second never written
	c := b.With(1, set(11))
	if got := a.Len(); got != 1 {
		t.Fatalf("a.Len() = %d, want 1", got)
	}
	if got := b.Len(); got != 40 {
		t.Fatalf("b.Len() = %d, want 40", got)
	}
	for _, tt := range []struct {
		name string
		l    Levels
		k    int
		want float64
	}{
		{"a level 1", a, 1, 10}, {"a past its end", a, 40, 0},
		{"b level 1", b, 1, 10}, {"b skipped", b, 20, 0}, {"b level 40", b, 40, 40},
		{"c level 1", c, 1, 11}, {"c level 40", c, 40, 40}, {"c past its end", c, 41, 0}, {"c level 0", c, 0, 0},
	} {
		if got := tt.l.At(tt.k).DecodeTPS.Value; got != tt.want {
			t.Errorf("%s: At(%d) = %v, want %v", tt.name, tt.k, got, tt.want)
		}
	}
	if b.blocks[2] != c.blocks[2] {
		t.Error("With copied a block it did not change")
	}
	n := 0
	for k, l := range b.All() {
		n++
		if k != n || (k == 40) != (l.DecodeTPS.Value == 40) {
			t.Fatalf("All yielded level %d = %v at position %d", k, l.DecodeTPS.Value, n)
		}
	}
	if n != 40 {
		t.Fatalf("All yielded %d levels, want 40", n)
	}
}

// Levels encode as the plain array older stats files hold, and decode
// back to equal values.
func TestLevels_JSONIsThePlainArray(t *testing.T) {
	now := time.Unix(100, 0).UTC()
	ls := NewLevels(Level{DecodeTPS: EMA{Value: 70, N: 3}, Updated: now}, Level{}, Level{TTFTMs: EMA{Value: 5, N: 1}})
	got, err := json.Marshal(ls)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := json.Marshal([]Level{ls.At(1), ls.At(2), ls.At(3)})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(plain) {
		t.Fatalf("encoded %s, want %s", got, plain)
	}
	var back Levels
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(ls) || back.Len() != 3 {
		t.Fatalf("decoded %d levels unequal to the encoded 3", back.Len())
	}
	if ls.Equal(ls.With(2, func(l *Level) { l.Updated = now })) {
		t.Fatal("Equal missed a changed level")
	}
	ws, err := json.Marshal(WorkerStats{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(ws); strings.Contains(got, `"levels"`) {
		t.Fatalf("stats with no levels encode them: %s", got)
	}
}
