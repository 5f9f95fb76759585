package prefix

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestText_ChainProperty(t *testing.T) {
	a := strings.Repeat("a", 40) + strings.Repeat("b", 10) + strings.Repeat("c", 30)
	b := strings.Repeat("a", 40) + strings.Repeat("b", 10) + strings.Repeat("d", 30)
	ha, hb := Text(a, 10), Text(b, 10)
	if got, want := len(ha), 8; got != want {
		t.Fatalf("blocks of an 80-byte text with 10-byte blocks: got %d, want %d", got, want)
	}
	// The texts share their first 50 bytes: five blocks.
	for i := range ha {
		if same, want := ha[i] == hb[i], i < 5; same != want {
			t.Errorf("block %d: hashes equal = %v, want %v", i, same, want)
		}
	}
	// Equal blocks at different positions hash differently: the chain.
	if ha[0] == ha[1] {
		t.Errorf("block 1 (same bytes as block 0, after it) has block 0's hash %x", ha[0])
	}
	// A later difference never changes earlier hashes, and equal text
	// hashes equally on every call.
	if diff := cmp.Diff(Text(a, 10), ha); diff != "" {
		t.Errorf("hashes of the same text differ between calls (-got +want):\n%s", diff)
	}
}

func TestText_PartialBlockNotHashed(t *testing.T) {
	if got := Text("short", 10); len(got) != 0 {
		t.Fatalf("a 5-byte text with 10-byte blocks: got %d hashes, want none", len(got))
	}
	if got, want := len(Text(strings.Repeat("x", 25), 10)), 2; got != want {
		t.Fatalf("25 bytes in 10-byte blocks: got %d hashes, want %d", got, want)
	}
}

func TestHasher_WriteSplitsAnywhere(t *testing.T) {
	text := strings.Repeat("the quick brown fox ", 20)
	want := Text(text, 16)
	hs := NewHasher(16)
	for i := 0; i < len(text); i += 7 {
		hs.Write([]byte(text[i:min(i+7, len(text))]))
	}
	if diff := cmp.Diff(hs.Hashes(), want); diff != "" {
		t.Fatalf("hashes depend on how the text was written (-got +want):\n%s", diff)
	}
}

// chatBody builds a chat request body from role/content pairs.
func chatBody(t *testing.T, pairs ...string) []byte {
	t.Helper()
	var msgs []map[string]string
	for i := 0; i+1 < len(pairs); i += 2 {
		msgs = append(msgs, map[string]string{"role": pairs[i], "content": pairs[i+1]})
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFromBody_ChatTurnsSharePrefix(t *testing.T) {
	sys := strings.Repeat("You are a careful assistant. ", 30)
	q1 := strings.Repeat("What is a KV cache? ", 20)
	a1 := strings.Repeat("It stores keys and values. ", 20)
	turn1 := fromBody(chatBody(t, "system", sys, "user", q1), 64)
	turn2 := fromBody(chatBody(t, "system", sys, "user", q1, "assistant", a1, "user", "And why?"), 64)
	if len(turn1) == 0 || len(turn2) <= len(turn1) {
		t.Fatalf("blocks: turn 1 %d, turn 2 %d; want turn 2 longer and both non-empty", len(turn1), len(turn2))
	}
	// Turn 1's rendering is a prefix of turn 2's: all its whole blocks
	// recur.
	if diff := cmp.Diff(turn2[:len(turn1)], turn1); diff != "" {
		t.Errorf("turn 2 does not start with turn 1's blocks (-got +want):\n%s", diff)
	}
	// Another conversation with the same system prompt shares only the
	// system prompt's blocks.
	other := fromBody(chatBody(t, "system", sys, "user", strings.Repeat("Tell me a joke. ", 30)), 64)
	shared := 0
	for shared < min(len(other), len(turn1)) && other[shared] == turn1[shared] {
		shared++
	}
	renderedSys := len("<|system|>\n") + len(sys) + len("\n")
	if got, want := shared, renderedSys/64; got != want {
		t.Errorf("blocks shared with another conversation with the same system prompt: got %d, want %d", got, want)
	}
}

func TestFromBody_RolesMatter(t *testing.T) {
	text := strings.Repeat("same words ", 30)
	a := fromBody(chatBody(t, "user", text), 32)
	b := fromBody(chatBody(t, "assistant", text), 32)
	if len(a) == 0 || a[0] == b[0] {
		t.Fatalf("the same content under different roles shares its first block")
	}
}

func TestFromBody_Shapes(t *testing.T) {
	long := strings.Repeat("0123456789", 10) // 100 bytes
	parts := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":%q}]}]}`, long)
	plain := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, long)
	tests := []struct {
		name string
		body string
		want []uint64
	}{
		{"raw prompt is its text", fmt.Sprintf(`{"prompt":%q}`, long), Text(long, 32)},
		{"content parts render as their text", parts, fromBody([]byte(plain), 32)},
		{"token prompt hashes its JSON", `{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]}`, Text("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]", 32)},
		{"no prompt", `{"model":"m","input":"embed me"}`, nil},
		{"not JSON", `{"model":`, nil},
		{"short prompt", `{"prompt":"hi"}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(fromBody([]byte(tt.body), 32), tt.want); diff != "" {
				t.Fatalf("hashes (-got +want):\n%s", diff)
			}
		})
	}
}

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestIndex_MatchLongestLeadingRun(t *testing.T) {
	x := NewIndex(Options{})
	x.Record("m", []uint64{1, 2, 3, 4}, "a")
	tests := []struct {
		name   string
		hashes []uint64
		worker string
		want   float64
	}{
		{"all four recorded", []uint64{1, 2, 3, 4}, "a", 1},
		{"first two of four, then new blocks", []uint64{1, 2, 9, 10}, "a", 0.5},
		{"a later block known, the first not", []uint64{9, 2, 3, 4}, "a", 0},
		{"longer than recorded", []uint64{1, 2, 3, 4, 5, 6, 7, 8}, "a", 0.5},
		{"another worker", []uint64{1, 2, 3, 4}, "b", 0},
		{"no hashes", nil, "a", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := match(x, "m", tt.hashes, tt.worker); got != tt.want {
				t.Fatalf("Match(%v, %s) = %v, want %v", tt.hashes, tt.worker, got, tt.want)
			}
		})
	}
}

func TestIndex_ModelsAreSeparate(t *testing.T) {
	x := NewIndex(Options{})
	x.Record("llama", []uint64{1, 2}, "a")
	if got := match(x, "qwen", []uint64{1, 2}, "a"); got != 0 {
		t.Fatalf("blocks recorded for llama match for qwen on the same worker: %v", got)
	}
	if got := match(x, "llama", []uint64{1, 2}, "a"); got != 1 {
		t.Fatalf("Match for llama = %v, want 1", got)
	}
}

func TestIndex_CapacityEvictsLeastRecentKeepingRoots(t *testing.T) {
	x := NewIndex(Options{Capacity: 4})
	x.Record("m", []uint64{1, 2, 3}, "a")
	// Three more blocks: two of the first conversation's go. Recording
	// refreshes from last to first, so the roots (1, then 2) are the most
	// recent of the old ones and 3 goes first.
	x.Record("m", []uint64{10, 11}, "a")
	if got, want := x.Len("m", "a"), 4; got != want {
		t.Fatalf("blocks remembered: got %d, want the capacity %d", got, want)
	}
	if got, want := match(x, "m", []uint64{1, 2, 3}, "a"), 2.0/3; got != want {
		t.Fatalf("Match of the old conversation = %v, want %v (block 3 evicted first)", got, want)
	}
	x.Record("m", []uint64{20, 21, 22, 23}, "a")
	if got := match(x, "m", []uint64{1}, "a"); got != 0 {
		t.Fatalf("block 1 survived four newer blocks in a capacity of 4: Match = %v", got)
	}
	if got := match(x, "m", []uint64{20, 21, 22, 23}, "a"); got != 1 {
		t.Fatalf("the newest conversation: Match = %v, want 1", got)
	}
}

// Nothing is forgotten by age: an engine keeps a block until it needs
// the room.
func TestIndex_NoExpiry(t *testing.T) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	x := NewIndex(Options{Now: clk.now})
	x.Record("m", []uint64{1, 2}, "a")
	x.Apply("m", []uint64{3}, "a", clk.t.Add(-time.Hour))
	clk.t = clk.t.Add(24 * time.Hour)
	x.Record("m", []uint64{4}, "a")
	if got := match(x, "m", []uint64{1, 2}, "a"); got != 1 {
		t.Errorf("a day on, Match = %v, want 1", got)
	}
	if got := x.Len("m", "a"); got != 4 {
		t.Errorf("blocks remembered: %d, want 4", got)
	}
}

func TestIndex_Forget(t *testing.T) {
	x := NewIndex(Options{})
	x.Record("m", []uint64{1}, "a")
	x.Record("m", []uint64{1}, "b")
	x.Forget("a")
	if match(x, "m", []uint64{1}, "a") != 0 || match(x, "m", []uint64{1}, "b") != 1 {
		t.Fatalf("Forget(a) should drop a's blocks and keep b's")
	}
}

// TestIndex_BoundedUnderChurn records many random conversations and checks
// the index never holds more than its capacity and still answers for the
// latest ones: the linked slab stays consistent through evictions and
// expiries.
func TestIndex_BoundedUnderChurn(t *testing.T) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	x := NewIndex(Options{Capacity: 50, Now: clk.now})
	for i := range 2000 {
		n := 1 + i%17
		hs := make([]uint64, n)
		for j := range hs {
			hs[j] = uint64(i%23)<<32 | uint64(j+1) // conversations recur
		}
		clk.t = clk.t.Add(time.Duration(i%5) * time.Second)
		x.Record("m", hs, "a")
		if i%7 == 0 { // a worker that found less, or more, than believed
			x.Correct("m", "a", hs, n, i%3)
		}
		if got, c := x.Len("m", "a"), x.Capacity("a"); got > c || c > 50 {
			t.Fatalf("after %d records the index holds %d blocks, over its capacity of %d (at most 50)", i+1, got, c)
		}
		if got, want := match(x, "m", hs, "a"), float64(min(n, x.Capacity("a")))/float64(n); got != want {
			t.Fatalf("record %d: Match of what was just recorded = %v, want %v", i+1, got, want)
		}
	}
}

func BenchmarkFromBody(b *testing.B) {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are helpful. ", 100)}}
	for i := range 10 {
		msgs = append(msgs, map[string]string{"role": []string{"user", "assistant"}[i%2], "content": strings.Repeat("a sentence of the conversation ", 40)})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		fromBody(body, BlockBytes)
	}
}

func BenchmarkIndex_Match(b *testing.B) {
	x := NewIndex(Options{})
	hs := Text(strings.Repeat("x", 100*BlockBytes), BlockBytes)
	x.Record("m", hs, "a")
	b.ReportAllocs()
	for b.Loop() {
		match(x, "m", hs, "a")
	}
}

func BenchmarkIndex_Record(b *testing.B) {
	x := NewIndex(Options{})
	convs := make([][]uint64, 64)
	for i := range convs {
		convs[i] = Text(fmt.Sprintf("%d", i)+strings.Repeat("x", 40*BlockBytes), BlockBytes)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		x.Record("m", convs[i%len(convs)], "a")
		i++
	}
}

func TestIndex_WorkerCapacity(t *testing.T) {
	x := NewIndex(Options{Capacity: 8, WorkerCapacity: map[string]int{"small": 2}})
	conv := []uint64{1, 2, 3, 4}
	x.Record("m", conv, "big")
	x.Record("m", conv, "small")
	if got, want := x.Len("m", "big"), 4; got != want {
		t.Errorf("big worker remembers %d blocks, want %d", got, want)
	}
	if got, want := x.Len("m", "small"), 2; got != want {
		t.Errorf("small worker remembers %d blocks, want its capacity %d", got, want)
	}
	if got, want := match(x, "m", conv, "small"), 0.5; got != want {
		t.Errorf("Match on the small worker = %v, want %v (its first two blocks)", got, want)
	}
}

func TestIndex_Apply(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	x := NewIndex(Options{Capacity: 4, Now: clk.now})
	x.Apply("m", []uint64{1, 2}, "a", t0.Add(-40*time.Second))
	if got, remote := matchSource(x, "m", []uint64{1, 2}, "a"); got != 1 || !remote {
		t.Fatalf("after Apply: MatchSource = %v, %v; want 1, true", got, remote)
	}
	// A local record of block 1 makes it local; block 2 stays remote.
	x.Record("m", []uint64{1}, "a")
	if _, remote := matchSource(x, "m", []uint64{1}, "a"); remote {
		t.Errorf("block 1 recorded here after the report: MatchSource says remote")
	}
	if _, remote := matchSource(x, "m", []uint64{1, 2}, "a"); !remote {
		t.Errorf("block 2 only reported: MatchSource says local")
	}
	// An older report does not set a newer block's time back.
	x.Apply("m", []uint64{1}, "a", t0.Add(-50*time.Second))
	if _, remote := matchSource(x, "m", []uint64{1}, "a"); remote {
		t.Errorf("an older report made block 1 remote again")
	}
	// A report from the future counts as now: a local record after it
	// makes the block local.
	x.Apply("m", []uint64{7}, "b", clk.t.Add(time.Hour))
	clk.t = clk.t.Add(time.Second)
	x.Record("m", []uint64{7}, "b")
	if _, remote := matchSource(x, "m", []uint64{7}, "b"); remote {
		t.Errorf("a report from the future outranked a later local record")
	}
	// Capacity bounds applied blocks as it bounds recorded ones.
	x.Apply("m", []uint64{10, 11, 12, 13, 14, 15}, "c", clk.t)
	if got, want := x.Len("m", "c"), 4; got != want {
		t.Errorf("applied 6 blocks with capacity 4: %d remembered, want %d", got, want)
	}
	if got, want := match(x, "m", []uint64{10, 11, 12, 13, 14, 15}, "c"), 4.0/6; got != want {
		t.Errorf("the first blocks are the ones kept: Match = %v, want %v", got, want)
	}
}

// MatchSources answers for each worker what MatchSource answers for it:
// blocks recorded here and by other replicas, for workers with and
// without a cache of the model.
func TestIndex_MatchSourcesIsMatchSourceForEach(t *testing.T) {
	now := time.Unix(5000, 0)
	x := NewIndex(Options{Capacity: 6, Now: func() time.Time { return now }})
	rng := rand.New(rand.NewPCG(1, 2))
	workers := []string{"a", "b", "c", "d", "e"}
	for range 200 {
		w := workers[rng.IntN(len(workers)-1)] // e is never recorded
		hashes := []uint64{uint64(rng.IntN(3)), uint64(rng.IntN(4)), uint64(rng.IntN(5))}
		if rng.IntN(3) == 0 {
			x.Apply("m", hashes, w, now.Add(-time.Duration(rng.IntN(90))*time.Second))
		} else {
			x.Record("m", hashes, w)
		}
		now = now.Add(time.Duration(rng.IntN(20)) * time.Second)
		for _, ask := range [][]uint64{nil, {0}, {0, 1}, {1, 2, 3}, hashes} {
			for _, model := range []string{"m", "other"} {
				frac, remote := make([]float64, len(workers)), make([]bool, len(workers))
				for i := range frac {
					frac[i], remote[i] = 9, true // overwritten, every one
				}
				x.MatchSources(model, ask, workers, frac, remote)
				for i, w := range workers {
					if f, r := matchSource(x, model, ask, w); f != frac[i] || r != remote[i] {
						t.Fatalf("%s, %s, %v: MatchSources says %v, %t; MatchSource %v, %t", w, model, ask, frac[i], remote[i], f, r)
					}
				}
			}
		}
	}
}

// match is MatchSources for one worker.
func match(x interface {
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
}, model string, hashes []uint64, worker string) float64 {
	f, _ := matchSource(x, model, hashes, worker)
	return f
}

// matchSource is MatchSources for one worker, with whether the match came
// from another replica.
func matchSource(x interface {
	MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool)
}, model string, hashes []uint64, worker string) (float64, bool) {
	frac, remote := make([]float64, 1), make([]bool, 1)
	x.MatchSources(model, hashes, []string{worker}, frac, remote)
	return frac[0], remote[0]
}
