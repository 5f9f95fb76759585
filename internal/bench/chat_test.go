package bench

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSynthesizeChat_TurnsExtendTheirConversation(t *testing.T) {
	c := Chat{Arrivals: Arrivals{Rate: 2}, Count: 400, Seed: 3, SystemTokens: 1000, BlockTokens: 100}
	items, err := SynthesizeChat(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 400 {
		t.Fatalf("got %d items, want 400", len(items))
	}
	again, _ := SynthesizeChat(c)
	if diff := cmp.Diff(items, again); diff != "" {
		t.Fatalf("same Chat, different load:\n%s", diff)
	}
	// The item whose hashes extend another's the furthest is the same
	// conversation's previous turn: its whole prefix recurs.
	later := 0
	for i, it := range items {
		if i > 0 && it.At < items[i-1].At {
			t.Fatalf("items not sorted by arrival at %d", i)
		}
		if got, want := len(it.Prefix), it.PromptTokens/100; got != want || it.PrefixBlockTokens != 100 {
			t.Fatalf("item %d: %d blocks of %d tokens for a %d-token prompt; want %d blocks of 100", i, got, it.PrefixBlockTokens, it.PromptTokens, want)
		}
		for j := range i {
			p := items[j].Prefix
			if len(p) > 10 && len(p) <= len(it.Prefix) && cmp.Equal(it.Prefix[:len(p)], p) {
				later++ // a later turn starting with an earlier turn's whole prompt
				if it.PromptTokens <= items[j].PromptTokens+items[j].OutputTokens {
					t.Fatalf("item %d extends item %d but is not longer than its prompt plus reply", i, j)
				}
				break
			}
		}
	}
	if later < 100 {
		t.Fatalf("only %d of 400 requests continue an earlier turn; want most (mean 4 turns)", later)
	}
}

func TestSynthesizeChat_SystemPromptBlocksShared(t *testing.T) {
	items, err := SynthesizeChat(Chat{Arrivals: Arrivals{Rate: 1}, Count: 50, Seed: 1, SystemPrompts: 1, SystemTokens: 1000, BlockTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	// Ten whole system blocks (1000 tokens) are shared by everyone; the
	// eleventh block holds conversation text.
	first := items[0].Prefix
	for _, it := range items {
		if diff := cmp.Diff(it.Prefix[:10], first[:10]); diff != "" {
			t.Fatalf("item %d does not share the system prompt's blocks:\n%s", it.Row, diff)
		}
	}
	distinct := map[uint64]bool{}
	for _, it := range items {
		if len(it.Prefix) > 10 {
			distinct[it.Prefix[10]] = true
		}
	}
	if len(distinct) < 5 {
		t.Fatalf("block 10 (after the system prompt) has only %d distinct hashes over 50 turns", len(distinct))
	}
}

func TestSynthesizeChat_Invalid(t *testing.T) {
	for _, c := range []Chat{
		{Arrivals: Arrivals{Rate: 1}},
		{Arrivals: Arrivals{Rate: 1}, Count: 5, Turns: 0.5},
		{Count: 5},
	} {
		if _, err := SynthesizeChat(c); err == nil {
			t.Errorf("SynthesizeChat(%+v) succeeded; want an error", c)
		}
	}
}
