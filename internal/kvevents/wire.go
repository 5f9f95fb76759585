package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// Event kinds.
const (
	KindStored  = "BlockStored"
	KindRemoved = "BlockRemoved"
	KindCleared = "AllBlocksCleared"
)

// Hash is vLLM's block hash (ExternalBlockHash: an int or bytes), kept
// as a comparable string: "i" and the int's 8 bytes, or "b" and the bytes.
type Hash string

// IntHash is the Hash of an int block hash.
func IntHash(v int64) Hash {
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], uint64(v))
	return Hash(b[:])
}

// Event is one KV-cache event.
type Event struct {
	Kind        string
	BlockHashes []Hash
	Parent      Hash // "" when none
	TokenIDs    []uint32
	BlockSize   int
	Medium      string
}

// Batch is one KVEventBatch with its seq from the message.
type Batch struct {
	Seq    int64
	TS     float64
	Events []Event
}

// ErrMalformed wraps every decoding failure.
var ErrMalformed = errors.New("malformed KV event batch")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Decode reads a KVEventBatch payload, array or map encoded, with its
// events array (tag first) or map ("type" tag) encoded.
func Decode(payload []byte) (Batch, error) {
	var v any
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	dec.UseLooseInterfaceDecoding(true)
	if err := dec.Decode(&v); err != nil {
		return Batch{}, malformed("%v", err)
	}
	var b Batch
	var events any
	switch x := v.(type) {
	case []any:
		if len(x) < 2 {
			return Batch{}, malformed("batch array of %d fields, want ts, events[, data_parallel_rank]", len(x))
		}
		b.TS = toFloat(x[0])
		events = x[1]
	case map[string]any:
		b.TS = toFloat(x["ts"])
		events = x["events"]
	default:
		return Batch{}, malformed("batch is a %T, want an array or a map", v)
	}
	evs, ok := events.([]any)
	if !ok {
		return Batch{}, malformed("events is a %T, want an array", events)
	}
	for i, e := range evs {
		ev, err := decodeEvent(e)
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	return b, nil
}

// Field order of the array-encoded events, after the tag.
var fieldOrder = map[string][]string{
	KindStored:  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	KindRemoved: {"block_hashes", "medium"},
	KindCleared: {},
}

func decodeEvent(e any) (Event, error) {
	fields := map[string]any{}
	var kind string
	switch x := e.(type) {
	case []any:
		if len(x) == 0 {
			return Event{}, malformed("empty event array")
		}
		kind, _ = x[0].(string)
		names, ok := fieldOrder[kind]
		if !ok {
			return Event{}, malformed("unknown event tag %v", x[0])
		}
		for i, n := range names {
			if i+1 < len(x) {
				fields[n] = x[i+1]
			}
		}
	case map[string]any:
		kind, _ = x["type"].(string)
		if _, ok := fieldOrder[kind]; !ok {
			return Event{}, malformed("unknown event type %v", x["type"])
		}
		fields = x
	default:
		return Event{}, malformed("event is a %T", e)
	}
	ev := Event{Kind: kind}
	if kind == KindCleared {
		return ev, nil
	}
	hs, ok := fields["block_hashes"].([]any)
	if !ok {
		return Event{}, malformed("%s without block_hashes", kind)
	}
	for _, h := range hs {
		hh, err := toHash(h)
		if err != nil {
			return Event{}, err
		}
		ev.BlockHashes = append(ev.BlockHashes, hh)
	}
	ev.Medium, _ = fields["medium"].(string)
	if kind == KindRemoved {
		return ev, nil
	}
	if p := fields["parent_block_hash"]; p != nil {
		ph, err := toHash(p)
		if err != nil {
			return Event{}, err
		}
		ev.Parent = ph
	}
	toks, ok := fields["token_ids"].([]any)
	if !ok {
		return Event{}, malformed("BlockStored without token_ids")
	}
	ev.TokenIDs = make([]uint32, len(toks))
	for i, t := range toks {
		n, ok := toInt(t)
		if !ok || n < 0 || n > 1<<32-1 {
			return Event{}, malformed("token id %v", t)
		}
		ev.TokenIDs[i] = uint32(n)
	}
	bs, ok := toInt(fields["block_size"])
	if !ok || bs <= 0 {
		return Event{}, malformed("block_size %v", fields["block_size"])
	}
	ev.BlockSize = int(bs)
	if len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
		return Event{}, malformed("%d token ids for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
	}
	return ev, nil
}

// toHash reads a block hash; Decode's loose decoding gives bytes as a
// string and every int as an int64 or a uint64.
func toHash(v any) (Hash, error) {
	if x, ok := v.(string); ok {
		return Hash("b" + x), nil
	}
	if n, ok := toInt(v); ok {
		return IntHash(n), nil
	}
	return "", malformed("block hash %v (%T), want an int or bytes", v, v)
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), true
	}
	return 0, false
}

func toFloat(v any) float64 {
	if x, ok := v.(float64); ok {
		return x
	}
	n, _ := toInt(v)
	return float64(n)
}

// encode writes a batch as vLLM's array_like msgspec encoding does:
// [ts, [events...], data_parallel_rank 0], each event [tag, fields...] in
// declaration order (lora_id and lora_name nil). The simulators publish
// with it.
func encode(b Batch) ([]byte, error) {
	evs := make([]any, len(b.Events))
	for i, e := range b.Events {
		hashes := make([]any, len(e.BlockHashes))
		for j, h := range e.BlockHashes {
			hashes[j] = hashValue(h)
		}
		medium := any(nil)
		if e.Medium != "" {
			medium = e.Medium
		}
		switch e.Kind {
		case KindStored:
			var parent any
			if e.Parent != "" {
				parent = hashValue(e.Parent)
			}
			evs[i] = []any{KindStored, hashes, parent, e.TokenIDs, e.BlockSize, nil, medium, nil}
		case KindRemoved:
			evs[i] = []any{KindRemoved, hashes, medium}
		case KindCleared:
			evs[i] = []any{KindCleared}
		default:
			return nil, fmt.Errorf("kvevents: unknown event kind %q", e.Kind)
		}
	}
	return msgpack.Marshal([]any{b.TS, evs, 0})
}

func hashValue(h Hash) any {
	if strings.HasPrefix(string(h), "i") && len(h) == 9 {
		return int64(binary.BigEndian.Uint64([]byte(h[1:])))
	}
	return []byte(h[1:])
}
