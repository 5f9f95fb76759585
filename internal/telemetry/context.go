package telemetry

import (
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
}

// ParseModelCards reads an OpenAI GET /v1/models list like
// ParseOpenAIModels and keeps each entry's max_model_len. Entries with an
// empty or repeated id are dropped; an empty list is a non-nil empty
// slice.
func ParseModelCards(r io.Reader) ([]ModelCard, error) {
	var l struct {
		Data *[]struct {
			ID          string `json:"id"`
			MaxModelLen *int   `json:"max_model_len"`
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

// SlotState is one llama.cpp slot as GET /slots reports it.
type SlotState struct {
	// ID is the slot's index.
	ID int `json:"id"`
	// NCtx is the slot's context size in tokens (the server's --ctx-size
	// divided among --parallel slots).
	NCtx int `json:"n_ctx"`
	// IsProcessing reports the slot busy with a request.
	IsProcessing bool `json:"is_processing"`
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
}

// ParseLlamaCPPSlots reads llama.cpp's GET /slots (enabled by default;
// --no-slots turns it off): a JSON array of slots, each with id, n_ctx and
// is_processing among much else. A body that is not an array, or has no
// slot, is an error; a slot without n_ctx leaves NCtx 0 and returns the
// rest with a *MissingError.
func ParseLlamaCPPSlots(r io.Reader) (Slots, error) {
	var raw []struct {
		ID           int   `json:"id"`
		NCtx         *int  `json:"n_ctx"`
		IsProcessing *bool `json:"is_processing"`
	}
	if err := decodeJSON(r, &raw); err != nil {
		return Slots{}, fmt.Errorf("parse llama.cpp slots: %w", err)
	}
	if len(raw) == 0 {
		return Slots{}, fmt.Errorf("parse llama.cpp slots: %w", &MissingError{Metrics: []string{"slots (empty list)"}})
	}
	var s Slots
	var miss missing
	nctx := 0
	for _, sl := range raw {
		st := SlotState{ID: sl.ID}
		if sl.NCtx != nil && *sl.NCtx > 0 {
			st.NCtx = *sl.NCtx
			if nctx == 0 || st.NCtx < nctx {
				nctx = st.NCtx
			}
		} else {
			miss.add("slot %d n_ctx", sl.ID)
		}
		if sl.IsProcessing != nil {
			st.IsProcessing = *sl.IsProcessing
		} else {
			miss.add("slot %d is_processing", sl.ID)
		}
		if st.IsProcessing {
			s.Busy++
		}
		s.Slots = append(s.Slots, st)
	}
	if len(miss) == 0 {
		s.NCtx = nctx
	}
	if err := miss.err(); err != nil {
		return s, fmt.Errorf("parse llama.cpp slots: %w", err)
	}
	return s, nil
}
