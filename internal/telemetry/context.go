package telemetry

import (
	"encoding/json"
	"fmt"
	"io"
)

// ModelCard is one entry of an OpenAI GET /v1/models list with the
// extension vLLM and SGLang add: the model's context length.
type ModelCard struct {
	// ID is the model's name.
	ID string `json:"id"`
	// MaxModelLen is the longest prompt plus completion the server
	// accepts for the model (vLLM's and SGLang's max_model_len); 0 when
	// the entry does not say (null for LoRA adapters, absent elsewhere).
	MaxModelLen int `json:"max_model_len,omitempty"`
	// Parent is the base model of a LoRA adapter: vLLM lists every
	// adapter it has loaded as a model whose parent is its base model
	// (null for a base model); empty for a base model.
	Parent string `json:"parent,omitempty"`
}

// ParseModelCards reads an OpenAI GET /v1/models list like
// ParseOpenAIModels and keeps each entry's max_model_len. Entries with an
// empty or repeated id are dropped; an empty list is a non-nil empty
// slice.
func ParseModelCards(r io.Reader) ([]ModelCard, error) {
	var l struct {
		Data *[]struct {
			ID          string  `json:"id"`
			MaxModelLen *int    `json:"max_model_len"`
			Parent      *string `json:"parent"`
		} `json:"data"`
	}
	if err := decodeJSON(r, &l); err != nil {
		return nil, fmt.Errorf("parse models: %w", err)
	}
	if l.Data == nil {
		return nil, fmt.Errorf("parse models: %w", ErrNoModelList)
	}
	out := []ModelCard{}
	seen := map[string]bool{}
	for _, d := range *l.Data {
		if d.ID == "" || seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		c := ModelCard{ID: d.ID}
		if d.Parent != nil && *d.Parent != d.ID {
			c.Parent = *d.Parent
		}
		if d.MaxModelLen != nil && *d.MaxModelLen > 0 {
			c.MaxModelLen = *d.MaxModelLen
		}
		out = append(out, c)
	}
	return out, nil
}

// IDs returns the cards' ids in order.
func IDs(cards []ModelCard) []string {
	ids := make([]string, 0, len(cards))
	for _, c := range cards {
		ids = append(ids, c.ID)
	}
	return ids
}

// SlotState is what one llama.cpp slot of GET /slots says of its prompt.
type SlotState struct {
	// ID is the slot's index.
	ID int `json:"id"`
	// Prompt is the text of the prompt the slot holds (its current task's,
	// or its last one's when idle), when the server reports it: see
	// ParseLlamaCPPSlots. HasPrompt tells an empty prompt from none.
	Prompt    string `json:"-"`
	HasPrompt bool   `json:"has_prompt,omitempty"`
}

// Slots is what llama.cpp's GET /slots says about its slots.
type Slots struct {
	// Slots lists every slot in the server's order.
	Slots []SlotState `json:"slots"`
	// Busy counts the slots processing a request.
	Busy int `json:"busy"`
	// NCtx is the context size of one slot, the smallest among them (they
	// are equal in practice): the longest request any slot can hold.
	NCtx int `json:"n_ctx"`
	// Prompts counts the slots that report their prompt text.
	Prompts int `json:"prompts,omitempty"`
	// KVUsage is the share of the KV cache held by running requests:
	// the tokens of the busy slots over the slots' n_ctx added up. See
	// ParseLlamaCPPSlots for when it is present and what it means.
	KVUsage Value `json:"kv_usage"`
}

// SlotsKVMetric names the derived KVUsage of /slots in readings.
const SlotsKVMetric = "n_prompt_tokens/n_ctx"

// ParseLlamaCPPSlots reads llama.cpp's GET /slots: a JSON array of slots,
// each with id, n_ctx and is_processing among much else. A body that is
// not an array, or has no slot, is an error; a slot without n_ctx leaves
// NCtx 0 and returns the rest with a *MissingError.
//
// What "prompt" holds depends on the build (tools/server of
// ggml-org/llama.cpp): the request's own JSON prompt, a string or token
// array, in early builds; the slot's tokens detokenized with special
// tokens rendered (so starting with the model's BOS text; a chat
// request's prompt is the chat template's output) in later ones; and in
// current ones nothing, unless the server runs with
// LLAMA_SERVER_SLOTS_DEBUG=1. --no-slots turns the endpoint off (501). A
// "prompt" that is a string is kept in Prompt; any other shape is
// ignored, as if absent.
//
// KVUsage stands in for the llamacpp:kv_cache_usage_ratio that current
// builds no longer export. Their slots report n_prompt_tokens, the size of
// the slot's cached sequence (server_slot::to_json: prompt.tokens.size(),
// which grows by every token sampled), so KVUsage is the busy slots'
// tokens over the sum of every slot's n_ctx. Idle slots are left out on
// purpose: what they hold is a cached prompt that the next request placed
// on the slot overwrites (or, with a unified cache, that the server purges
// when it needs room), not memory a new request must wait for. The sum of
// n_ctx is the whole cache when each slot has its own share, which is
// llama-server's default whenever --parallel is given; with --kv-unified
// (or --parallel left to auto) every slot's n_ctx is the whole cache and
// the fraction is low by the slot count, since neither /slots nor /props
// says which layout runs. KVUsage is absent (no error: older builds lack
// the field) unless every busy slot reports n_prompt_tokens and every slot
// its n_ctx; with no busy slot it is 0.
func ParseLlamaCPPSlots(r io.Reader) (Slots, error) {
	var raw []struct {
		ID           int             `json:"id"`
		NCtx         *int            `json:"n_ctx"`
		IsProcessing *bool           `json:"is_processing"`
		Prompt       json.RawMessage `json:"prompt"`
		NTokens      *int            `json:"n_prompt_tokens"`
	}
	if err := decodeJSON(r, &raw); err != nil {
		return Slots{}, fmt.Errorf("parse llama.cpp slots: %w", err)
	}
	if len(raw) == 0 {
		return Slots{}, fmt.Errorf("parse llama.cpp slots: %w", &MissingError{Metrics: []string{"slots (empty list)"}})
	}
	s := Slots{KVUsage: Value{Metric: SlotsKVMetric}}
	var miss missing
	nctx, sumCtx, busyTokens := 0, 0, 0
	tokensKnown := true
	for _, sl := range raw {
		st := SlotState{ID: sl.ID}
		if n := sl.NCtx; n != nil && *n > 0 {
			sumCtx += *n
			if nctx == 0 || *n < nctx {
				nctx = *n
			}
		} else {
			miss.add("slot %d n_ctx", sl.ID)
		}
		if sl.IsProcessing == nil {
			miss.add("slot %d is_processing", sl.ID)
		}
		// n_prompt_tokens (current builds) is what the slot holds in the
		// KV cache: its prompt and the tokens generated so far.
		if sl.IsProcessing != nil && *sl.IsProcessing {
			s.Busy++
			if n := sl.NTokens; n != nil && *n >= 0 {
				busyTokens += *n
			} else {
				tokensKnown = false
			}
		}
		if len(sl.Prompt) > 0 && sl.Prompt[0] == '"' && json.Unmarshal(sl.Prompt, &st.Prompt) == nil {
			st.HasPrompt = true
			s.Prompts++
		}
		s.Slots = append(s.Slots, st)
	}
	if len(miss) == 0 {
		s.NCtx = nctx
		if tokensKnown && sumCtx > 0 {
			s.KVUsage.V, s.KVUsage.Present = clamp01(float64(busyTokens)/float64(sumCtx)), true
		}
	}
	if err := miss.err(); err != nil {
		return s, fmt.Errorf("parse llama.cpp slots: %w", err)
	}
	return s, nil
}
