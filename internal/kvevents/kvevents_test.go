package kvevents

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
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
	want := Batch{TS: 1.5, Events: []Event{
		{Kind: KindStored, BlockHashes: []Hash{IntHash(11), IntHash(-12)}, TokenIDs: tokens(4, 0), BlockSize: 2, Medium: "GPU"},
		{Kind: KindStored, BlockHashes: []Hash{"b\x01\x02"}, Parent: IntHash(-12), TokenIDs: tokens(2, 4), BlockSize: 2, Medium: "GPU"},
		{Kind: KindRemoved, BlockHashes: []Hash{IntHash(11)}, Medium: "GPU"},
		{Kind: KindCleared},
	}}
	arrays, err := encode(want)
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

// stored is a batch storing one first block of 4 tokens from from, under
// vLLM hash h.
func stored(h int64, from int) []Event {
	return []Event{{Kind: KindStored, BlockHashes: []Hash{IntHash(h)}, TokenIDs: tokens(4, from), BlockSize: 4, Medium: "GPU"}}
}

// holds reports whether the index holds w's block of 4 tokens from from.
func holds(x *Index, w string, from int) bool {
	n, _, ok, _ := x.Match(w, BlockKeys(tokens(4, from), 4))
	return ok && n == 1
}

// startSubscriber runs sub until the test ends.
func startSubscriber(t *testing.T, sub *Subscriber) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A publisher that restarts counts its batches from 0 again and holds
// none of the blocks its previous process published: once the subscriber
// follows the new one, the old blocks are gone from the index and the
// new ones are there, though their seqs are below the last one seen.
func TestSubscriber_RestartedPublisherStartsTheIndexOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, err := NewPublisher(ctx, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep, rep := pub.Endpoints()
	x := NewIndex()
	startSubscriber(t, &Subscriber{Worker: "w", Endpoint: ep, Replay: rep, Index: x})
	if err := Join(ctx, func() { pub.Publish(0, nil) }, func(ctx context.Context) error { return x.Wait(ctx, "w", HasBatch) }); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		pub.Publish(1, stored(int64(100+i), 8*i))
	}
	if err := x.Wait(ctx, "w", func(Stats) bool { return holds(x, "w", 8*19) }); err != nil {
		t.Fatal(err)
	}
	pub.Close()

	// The same endpoints, another process: seq 0 again, other blocks.
	again, err := NewPublisher(ctx, strings.TrimPrefix(ep, "tcp://"), strings.TrimPrefix(rep, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	err = Join(ctx, func() { again.Publish(2, stored(100, 1000)) }, func(ctx context.Context) error {
		return x.Wait(ctx, "w", func(Stats) bool { return holds(x, "w", 1000) && !holds(x, "w", 0) })
	})
	if err != nil {
		st, _ := x.Stats("w")
		t.Fatalf("after the publisher restarted: new block held %v, old block held %v (%+v): %v", holds(x, "w", 1000), holds(x, "w", 0), st, err)
	}
	for i := range 20 {
		if holds(x, "w", 8*i) {
			t.Fatalf("the old process's block %d is still in the index", i)
		}
	}
}

// On one connection, a seq that goes back means the publisher restarted
// (vLLM counts from 0 in each process): its index starts over from that
// batch instead of dropping it as a duplicate.
func TestSubscriber_SeqGoingBackStartsTheIndexOver(t *testing.T) {
	x := NewIndex()
	sub := &Subscriber{Worker: "w", Index: x, Logger: slog.New(slog.DiscardHandler), last: -1}
	batch := func(events []Event) []byte {
		b, err := encode(Batch{TS: 1, Events: events})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for i := range 5 {
		sub.handle(context.Background(), int64(i), batch(stored(int64(100+i), 8*i)))
	}
	if !holds(x, "w", 0) {
		t.Fatal("the first process's block is not held")
	}
	sub.handle(context.Background(), 0, batch(stored(100, 1000)))
	st, _ := x.Stats("w")
	if holds(x, "w", 0) || !holds(x, "w", 1000) || st.Seq != 0 || st.Blocks != 1 {
		t.Fatalf("after seq 0 again: old held %v, new held %v, %+v; want only the new block, at seq 0", holds(x, "w", 0), holds(x, "w", 1000), st)
	}
}

// freeAddr is a loopback address nothing listens on (until the test
// listens there).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A subscriber started before its publisher — a vLLM still loading its
// model — dials again with backoff (1s doubling to 30s), saying it is
// connecting and why, for as long as it runs; once the publisher listens
// it connects and its index syncs.
func TestSubscriber_DialsAgainUntilThePublisherListens(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr, replayAddr := freeAddr(t), freeAddr(t)
	x := NewIndex()
	waits, resume := make(chan time.Duration), make(chan struct{})
	sub := &Subscriber{Worker: "w", Endpoint: "tcp://" + addr, Replay: "tcp://" + replayAddr, Index: x}
	sub.sleep = func(ctx context.Context, d time.Duration) error {
		select {
		case waits <- d:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-resume:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	errc, stopped := make(chan error, 1), make(chan struct{})
	go func() { defer close(stopped); errc <- sub.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	var got []time.Duration
	for i := range 8 {
		select {
		case d := <-waits:
			got = append(got, d)
		case err := <-errc:
			t.Fatalf("the subscriber gave up after %d waits (%v): %v", len(got), got, err)
		}
		if st := sub.Status(); st.Connected || !strings.Contains(st.LastError, "connection refused") || st.LastErrorAt.IsZero() {
			t.Fatalf("while nothing listens: %+v, want connecting, the dial's error", st)
		}
		if i < 7 {
			resume <- struct{}{}
		}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("waits between dials (-want +got):\n%s", diff)
	}

	pub, err := NewPublisher(ctx, addr, replayAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	resume <- struct{}{} // the eighth wait ends: the next dial finds the publisher
	if err := Join(ctx, func() { pub.Publish(0, stored(1, 0)) }, func(ctx context.Context) error { return x.Wait(ctx, "w", HasBatch) }); err != nil {
		t.Fatal(err)
	}
	if st := sub.Status(); !st.Connected || st.Connects != 1 {
		t.Fatalf("after the publisher came: %+v, want connected once", st)
	}
	if st, _ := x.Stats("w"); !st.Synced || !holds(x, "w", 0) {
		t.Fatalf("index %+v, want synced with the published block", st)
	}
}
