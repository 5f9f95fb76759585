package stats

import (
	"encoding/json"
	"iter"
)

// levelChunk is how many levels share one block of a Levels.
const levelChunk = 16

// Levels holds a worker's per-concurrency-level stats, levels 1 to Len().
// It is immutable like the WorkerStats that holds it, and stored in blocks
// of 16 levels so that folding an observation into one level copies that
// level's block and the short list of blocks, not every level: a busy
// worker running 250 streams would otherwise copy 18 KB per finished
// request. It encodes to JSON as the plain array of its levels.
type Levels struct {
	blocks []*[levelChunk]Level
	n      int
}

// NewLevels returns Levels holding ls, ls[0] being level 1.
func NewLevels(ls ...Level) Levels {
	out := Levels{blocks: make([]*[levelChunk]Level, (len(ls)+levelChunk-1)/levelChunk), n: len(ls)}
	for i := range out.blocks {
		out.blocks[i] = new([levelChunk]Level)
		copy(out.blocks[i][:], ls[i*levelChunk:])
	}
	return out
}

// Len returns the highest level held.
func (l Levels) Len() int { return l.n }

// At returns level k (1-based), or the zero Level when it is not held.
func (l Levels) At(k int) Level {
	if k < 1 || k > l.n {
		return Level{}
	}
	return l.get(k)
}

// get returns level k, 1 ≤ k ≤ l.n; a block never written (With skips
// to a level past it) is nil and reads as zero levels.
func (l Levels) get(k int) Level {
	if b := l.blocks[(k-1)/levelChunk]; b != nil {
		return b[(k-1)%levelChunk]
	}
	return Level{}
}

// All yields every level held, in order, with its 1-based number.
func (l Levels) All() iter.Seq2[int, Level] {
	return func(yield func(int, Level) bool) {
		for k := 1; k <= l.n; k++ {
			if !yield(k, l.get(k)) {
				return
			}
		}
	}
}

// With returns l with level k (k ≥ 1) changed by change, sharing
// every block but k's with l, which stays as it was. Levels below k not
// held before are zero.
func (l Levels) With(k int, change func(*Level)) Levels {
	b := (k - 1) / levelChunk
	blocks := make([]*[levelChunk]Level, max(len(l.blocks), b+1))
	copy(blocks, l.blocks)
	blk := new([levelChunk]Level)
	if old := blocks[b]; old != nil {
		*blk = *old
	}
	change(&blk[(k-1)%levelChunk])
	blocks[b] = blk
	return Levels{blocks: blocks, n: max(l.n, k)}
}

// MarshalJSON encodes l as the array of its levels.
func (l Levels) MarshalJSON() ([]byte, error) {
	out := make([]Level, 0, l.n)
	for _, lv := range l.All() {
		out = append(out, lv)
	}
	return json.Marshal(out)
}

// UnmarshalJSON decodes an array of levels, the first being level 1.
func (l *Levels) UnmarshalJSON(b []byte) error {
	var ls []Level
	if err := json.Unmarshal(b, &ls); err != nil {
		return err
	}
	*l = NewLevels(ls...)
	return nil
}

// IsZero reports whether l holds no level, so that omitzero leaves it out.
func (l Levels) IsZero() bool { return l.n == 0 }

// Equal reports whether l and o hold the same levels, however stored (go-cmp
// uses it to compare WorkerStats).
func (l Levels) Equal(o Levels) bool {
	if l.n != o.n {
		return false
	}
	for k, lv := range l.All() {
		ov := o.get(k)
		if lv.DecodeTPS != ov.DecodeTPS || lv.DecodeSq != ov.DecodeSq || lv.TTFTMs != ov.TTFTMs || !lv.Updated.Equal(ov.Updated) {
			return false
		}
	}
	return true
}
