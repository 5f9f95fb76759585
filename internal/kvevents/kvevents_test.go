package kvevents

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

func tokens(n, from int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// Both of vLLM's encodings decode to the same batch: array_like structs
// (tag first, fields in order) and maps with a "type" tag; block hashes
// may be ints or bytes.
func TestDecode(t *testing.T) {
	want := Batch{TS: 1.5, DPRank: 0, Events: []Event{
		{Kind: KindStored, BlockHashes: []Hash{IntHash(11), IntHash(-12)}, TokenIDs: tokens(4, 0), BlockSize: 2, Medium: "GPU"},
		{Kind: KindStored, BlockHashes: []Hash{"b\x01\x02"}, Parent: IntHash(-12), TokenIDs: tokens(2, 4), BlockSize: 2, Medium: "GPU", LoRAName: "sql"},
		{Kind: KindRemoved, BlockHashes: []Hash{IntHash(11)}, Medium: "GPU"},
		{Kind: KindCleared},
	}}
	arrays, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := msgpack.Marshal(map[string]any{"ts": 1.5, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{11, -12}, "parent_block_hash": nil, "token_ids": []any{0, 1, 2, 3}, "block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil},
		map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte{1, 2}}, "parent_block_hash": -12, "token_ids": []any{4, 5}, "block_size": 2, "lora_id": 1, "medium": "GPU", "lora_name": "sql"},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{11}, "medium": "GPU"},
		map[string]any{"type": "AllBlocksCleared"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for name, payload := range map[string][]byte{"array_like": arrays, "map": maps} {
		got, err := Decode(payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	bad := map[string]any{
		"not a batch":  "hello",
		"unknown tag":  []any{1.0, []any{[]any{"BlockMoved", []any{1}}}},
		"token count":  []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, 2, 3}, 2, nil, "GPU"}}},
		"float hashes": []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}, "GPU"}}},
	}
	for name, v := range bad {
		b, _ := msgpack.Marshal(v)
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

// The index keys blocks by its chained hash of their tokens, the same
// keys BlockKeys computes for a request: stored blocks match, removed
// ones stop matching, a cleared worker holds nothing.
func TestIndex_MatchesByTokens(t *testing.T) {
	x := NewIndex()
	req := BlockKeys(tokens(7, 0), 2) // 3 full blocks
	if len(req) != 3 {
		t.Fatalf("%d keys, want 3", len(req))
	}
	steps := []struct {
		name   string
		events []Event
		want   int
	}{
		{"first two blocks", []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(1), IntHash(2)}, TokenIDs: tokens(4, 0), BlockSize: 2}}, 2},
		{"the third, chained on its parent", []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(3)}, Parent: IntHash(2), TokenIDs: tokens(2, 4), BlockSize: 2}}, 3},
		{"other tokens under the same parent", []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(9)}, Parent: IntHash(1), TokenIDs: []uint32{7, 7}, BlockSize: 2}}, 3},
		{"second removed", []Event{{Kind: KindRemoved, BlockHashes: []Hash{IntHash(2)}}}, 1},
		{"an orphan (parent gone) is not indexed", []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(4)}, Parent: IntHash(2), TokenIDs: tokens(2, 2), BlockSize: 2}}, 1},
		{"cleared", []Event{{Kind: KindCleared}}, 0},
	}
	for i, st := range steps {
		x.Apply("w", Batch{Seq: int64(i), Events: st.events})
		n, seq, ok, _ := x.Match("w", req)
		if !ok || n != st.want || seq != int64(i) {
			t.Errorf("%s: match %d (seq %d, ok %v), want %d", st.name, n, seq, ok, st.want)
		}
	}
	if _, _, ok, why := x.Match("other", req); ok || why != "no KV events yet" {
		t.Errorf("unknown worker: ok %v %q", ok, why)
	}
	x.Desync("w", 7)
	if _, _, ok, why := x.Match("w", req); ok || why != "KV events lost from seq 7" {
		t.Errorf("after a gap: ok %v %q, want not ok", ok, why)
	}
	x.Apply("w", Batch{Seq: 8, Events: []Event{{Kind: KindCleared}}})
	if _, _, ok, _ := x.Match("w", req); !ok {
		t.Error("after AllBlocksCleared the index is exact again")
	}
}

// Over loopback ZeroMQ: a batch the PUB socket drops is detected by the
// gap in seq and repaired from the replay socket, so the index holds its
// blocks; without a replay socket the worker falls back to the guess.
func TestSubscriber_RepairsAGapByReplay(t *testing.T) {
	for _, withReplay := range []bool{true, false} {
		name := map[bool]string{true: "replay", false: "no replay"}[withReplay]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			pub, err := NewPublisher(ctx, "127.0.0.1:0", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			ep, rep := pub.Endpoints()
			if !withReplay {
				rep = ""
			}
			x := NewIndex()
			sub := &Subscriber{Worker: "w", Endpoint: ep, Replay: rep, Index: x}
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			// Empty batches until the subscriber has one, so the test
			// starts from a subscribed socket.
			if err := Join(ctx, func() { pub.Publish(0, nil) }, func(ctx context.Context) error { return x.Wait(ctx, "w", HasBatch) }); err != nil {
				t.Fatal(err)
			}
			stored := func(h int64, from int) []Event {
				return []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(h)}, TokenIDs: tokens(4, from), BlockSize: 4, Medium: "GPU"}}
			}
			pub.DropNext(1)
			pub.Publish(1, stored(100, 0)) // lost on the PUB socket
			last, _ := pub.Publish(2, stored(200, 50))
			if err := x.Wait(ctx, "w", func(s Stats) bool { return s.Seq >= last }); err != nil {
				t.Fatal(err)
			}
			gaps, replays := sub.Counts()
			n, _, ok, why := x.Match("w", BlockKeys(tokens(4, 0), 4))
			if withReplay {
				// (A gap before the first batch received, the slow joiner's,
				// is repaired the same way.)
				if gaps < 1 || replays != gaps || !ok || n != 1 {
					t.Fatalf("gaps %d replays %d; the dropped batch's block matched %d (ok %v %s); want every gap replayed and a match", gaps, replays, n, ok, why)
				}
			} else if gaps < 1 || ok {
				t.Fatalf("gaps %d, ok %v: want the gap seen and the index out of sync", gaps, ok)
			}
			cancel()
			<-done
		})
	}
}
