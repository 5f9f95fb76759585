// Package prefix lets the router send a conversation back to the worker
// that already holds its prompt prefix in KV cache.
//
// A prompt is cut into fixed-size blocks whose hashes form a chain: block
// i's hash covers blocks 0..i, so two prompts share hash i exactly when they
// share their first i+1 blocks, and comparing two lists of hashes from the
// front finds their common prefix. Only whole blocks are hashed (an
// inference server caches whole blocks too: vLLM's prefix cache works in
// blocks of 16 tokens; llama.cpp reuses a slot's cached prompt up to the
// first differing token).
//
// The router does not tokenize. Its blocks are BlockBytes bytes of text
// (BlockTokens tokens at about CharsPerToken bytes per token, the same
// estimate the proxy uses for prompt sizes), so a block boundary is a guess
// at where the worker's token blocks fall; since the same text always gives
// the same blocks, the guess is consistent, which is all matching needs.
// Chat requests are rendered to a canonical text first — each message's
// role and content in order, see Render — which approximates, but is not,
// the model's chat template: the rendering of a conversation's turn n is a
// prefix of the rendering of its turn n+1, as the template's output is.
// Traces that carry real block hashes (Mooncake's hash_ids, 512-token
// blocks) are used as they are.
//
// An Index remembers, per model, which worker recently served which block
// hashes; the scheduler asks it how much of a request's prefix each worker
// is expected to hold (MatchSources) and tells it where a request went
// (Record). It is the router's guess of the workers' caches, not their
// state.
//
// What workers say of their own caches complements the guess:
//
//   - llama.cpp's GET /slots names each slot's prompt (always in builds
//     before October 2025, under LLAMA_SERVER_SLOTS_DEBUG=1 since
//     ggml-org/llama.cpp#16482). The fleet cuts it with Text into these
//     same blocks, and the scheduler takes
//     that report where it holds more than the guess (see
//     scheduler.CacheReport for the merge and why a report never lowers
//     the guess).
//   - vLLM tells which blocks it holds only through KV-cache events
//     (vllm/distributed/kv_events.py), whose block hashes are of token ids
//     in vLLM's own blocks; package kvevents keeps them as an exact index,
//     used where a request's token ids are known. Its
//     prefix_cache_hits/queries counters only say how often the worker
//     hit, over all requests, which says nothing about which prompt is
//     where, so they are shown (/api/workers), not scored: scaling the
//     guess by that rate would move requests on evidence about other
//     requests.
//   - Both report their KV cache size (vLLM's num_gpu_blocks × block_size
//     in vllm:cache_config_info, llama.cpp's n_ctx), which sizes an
//     Index's memory of the worker (SetCapacity) in place of Capacity.
package prefix

import (
	"encoding/json"
	"unicode/utf8"
)

// The router's block size. BlockTokens is a compromise between precision
// (a prefix is matched to within one block) and the index's memory (one
// entry per block per worker).
const (
	// CharsPerToken is the bytes of text per token assumed for English
	// BPE vocabularies, as the proxy's prompt estimate assumes.
	CharsPerToken = 4
	// BlockTokens is the router's block size in (estimated) tokens.
	BlockTokens = 128
	// BlockBytes is the router's block size in bytes of rendered text.
	BlockBytes = BlockTokens * CharsPerToken
)

// FNV-1a, 64 bits: stable across processes and versions, unlike
// hash/maphash, so recorded hashes stay comparable.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// Hasher cuts a stream of text into blocks of a fixed size and chains
// their hashes. The zero value is not usable; use NewHasher.
type Hasher struct {
	block  int
	fill   int    // bytes of the current block so far
	h      uint64 // running hash of the current block, seeded by prev
	prev   uint64 // hash of the previous block (the chain)
	hashes []uint64
}

// NewHasher returns a Hasher with blocks of blockBytes bytes (BlockBytes
// when not positive).
func NewHasher(blockBytes int) *Hasher {
	if blockBytes <= 0 {
		blockBytes = BlockBytes
	}
	hs := &Hasher{block: blockBytes}
	hs.Reset()
	return hs
}

// Reset starts a new prompt, keeping the hashes slice's memory.
func (hs *Hasher) Reset() {
	hs.fill, hs.prev, hs.hashes = 0, 0, hs.hashes[:0]
	hs.h = seed(0)
}

// seed starts a block's hash from the previous block's.
func seed(prev uint64) uint64 {
	h := uint64(fnvOffset)
	for i := range 8 {
		h ^= (prev >> (8 * i)) & 0xff
		h *= fnvPrime
	}
	return h
}

// Write adds text; it never fails.
func (hs *Hasher) Write(p []byte) (int, error) { return write(hs, p) }

// WriteString adds text; it never fails.
func (hs *Hasher) WriteString(s string) (int, error) { return write(hs, s) }

func write[T string | []byte](hs *Hasher, p T) (int, error) {
	for i := 0; i < len(p); i++ {
		hs.h ^= uint64(p[i])
		hs.h *= fnvPrime
		hs.fill++
		if hs.fill == hs.block {
			hs.endBlock()
		}
	}
	return len(p), nil
}

func (hs *Hasher) endBlock() {
	if hs.h == 0 {
		hs.h = 1 // 0 is never a block hash, so it can mean "none"
	}
	hs.hashes = append(hs.hashes, hs.h)
	hs.prev, hs.fill = hs.h, 0
	hs.h = seed(hs.prev)
}

// Hashes returns the chained hashes of the whole blocks written so far (a
// trailing partial block is not hashed). The slice is the Hasher's until
// the next Reset.
func (hs *Hasher) Hashes() []uint64 { return hs.hashes }

// Text returns the chained block hashes of a raw prompt.
func Text(s string, blockBytes int) []uint64 {
	hs := NewHasher(blockBytes)
	hs.WriteString(s)
	return hs.Hashes()
}

// Message is one chat message as Render reads it: its role and content
// (a JSON string, or an array of parts whose "text" fields are taken).
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// TextWriter is what Render writes to: a *Hasher, or a *strings.Builder
// for the text itself (PromptText).
type TextWriter interface {
	Write(p []byte) (int, error)
	WriteString(s string) (int, error)
}

// Render writes the canonical text of a chat conversation to hs: for each
// message in order, "<|role|>\n", its content and "\n". It approximates a
// chat template (each template wraps role and content in its own markers;
// the router does not know which the worker applies) and keeps the
// property that matters: a conversation's rendering is a prefix of the
// rendering of the same conversation with more messages.
func Render(hs TextWriter, msgs []Message) {
	for _, m := range msgs {
		hs.WriteString("<|")
		hs.WriteString(m.Role)
		hs.WriteString("|>\n")
		writeContent(hs, m.Content)
		hs.WriteString("\n")
	}
}

// writeContent writes a message content: a string as its text, an array
// of parts as the text of each part (other parts, e.g. images, by their
// JSON), anything else as its JSON.
func writeContent(hs TextWriter, raw json.RawMessage) {
	if len(raw) == 0 || string(raw) == "null" {
		return
	}
	switch raw[0] {
	case '"':
		if s, ok := plainString(raw); ok {
			hs.Write(s)
			return
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			hs.WriteString(s)
			return
		}
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if json.Unmarshal(raw, &parts) == nil {
			var other []json.RawMessage
			for i, p := range parts {
				if p.Text != nil {
					hs.WriteString(*p.Text)
					continue
				}
				if other == nil {
					_ = json.Unmarshal(raw, &other)
				}
				if i < len(other) {
					hs.Write(other[i])
				}
			}
			return
		}
	}
	hs.Write(raw)
}

// plainString returns the text of a JSON string that has no escapes, no
// control characters and no invalid UTF-8: its bytes between the quotes,
// which is what json.Unmarshal would give, without a second pass over a
// body already decoded. ok is false for any other raw; decode that.
func plainString(raw []byte) (text []byte, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	text = raw[1 : len(raw)-1]
	ascii := true
	for _, c := range text {
		switch {
		case c == '"' || c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return text, ascii || utf8.Valid(text)
}

// FromFields returns the chained block hashes (blocks of blockBytes bytes)
// of an OpenAI-style inference request already decoded, from its
// `messages` and `prompt` fields as they were sent (either may be empty):
// the rendered messages of a chat request, else its prompt (a string as
// its text; an array of strings or of token ids by its JSON, which is
// stable for equal prompts). Fields it cannot read, or no prompt, give no
// hashes: prefix matching is a hint, and the proxy has validated the body
// already.
func FromFields(messages, prompt json.RawMessage, blockBytes int) []uint64 {
	msgs, ok := decodeMessages(messages)
	if !ok {
		return nil
	}
	return FromMessages(msgs, prompt, blockBytes)
}

// decodeMessages decodes a `messages` field; absent or null is no
// messages, ok false a field that is not a list of messages.
func decodeMessages(messages json.RawMessage) (msgs []Message, ok bool) {
	if len(messages) > 0 && string(messages) != "null" && json.Unmarshal(messages, &msgs) != nil {
		return nil, false
	}
	return msgs, true
}

// FromMessages is FromFields for a body whose `messages` its caller has
// decoded already (into msgs) and whose `prompt` it holds as sent: the
// proxy's one decode of a request yields both.
func FromMessages(msgs []Message, prompt json.RawMessage, blockBytes int) []uint64 {
	hs := NewHasher(blockBytes)
	if !writePrompt(hs, msgs, prompt) || len(hs.hashes) == 0 {
		return nil
	}
	return hs.Hashes()
}

// writePrompt writes the rendered messages, else a string prompt's text,
// else the prompt's JSON; false when the prompt is a string that does not
// decode.
func writePrompt(w TextWriter, msgs []Message, prompt json.RawMessage) bool {
	switch {
	case len(msgs) > 0:
		Render(w, msgs)
	case len(prompt) > 0 && prompt[0] == '"':
		if s, ok := plainString(prompt); ok {
			w.Write(s)
			break
		}
		var s string
		if json.Unmarshal(prompt, &s) != nil {
			return false
		}
		w.WriteString(s)
	case len(prompt) > 0 && string(prompt) != "null":
		w.Write(prompt)
	}
	return true
}
