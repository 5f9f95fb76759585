package scheduler

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sluice-router/sluice/internal/prefix"
)

// The term is the prompt left to prefill on each candidate, as a share of
// the most any candidate has left.
func TestUncachedPrompt_Score(t *testing.T) {
	tests := []struct {
		name     string
		prompt   int
		match    []float64
		raw, nrm []float64
	}{
		{"one holds half", 4000, []float64{0, 0.5}, []float64{4000, 2000}, []float64{1, 0.5}},
		{"one holds it all", 1000, []float64{1, 0.25}, []float64{0, 750}, []float64{0, 1}},
		{"nothing to prefill", 1000, []float64{1, 1}, []float64{0, 0}, []float64{0, 0}},
		{"no prompt size", 0, []float64{0, 0.5}, []float64{0, 0}, []float64{0, 0}},
		{"match over 1 clamped", 800, []float64{1.5, 0}, []float64{0, 800}, []float64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]Candidate, len(tt.match))
			for i, m := range tt.match {
				cands[i] = Candidate{PrefixMatch: m}
			}
			raw, norm := make([]float64, len(cands)), make([]float64, len(cands))
			uncachedPrompt{}.Score(&Env{Req: &Request{PromptTokens: tt.prompt}}, cands, raw, norm)
			if diff := cmp.Diff(tt.raw, raw); diff != "" {
				t.Errorf("raw (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.nrm, norm); diff != "" {
				t.Errorf("norm (-want +got):\n%s", diff)
			}
		})
	}
}

// Turned on by its weight alone, the term sends a long prompt to the
// worker holding most of it, busier by one stream, where with the term off
// the idle worker wins; and the prefix index is asked though the prefix
// term's weight is 0.
func TestUncachedPrompt_LongPromptGoesToItsCache(t *testing.T) {
	hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	for _, tt := range []struct {
		name   string
		weight float64
		want   string
	}{
		{"off", 0, "w1"},
		{"on", 150, "w0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := DefaultWeights()
			w.Prefix = 0
			w.Optional = map[string]float64{"uncached_prompt": tt.weight}
			idx := prefix.NewIndex(prefix.Options{})
			idx.Record("m", hashes, "w0")
			s := newSched(t, Config{MaxQueue: 4, Weights: w, PrefixIndex: idx}, workers(2, 4, "m")...)
			busy, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 10, Exclude: []string{"w1"}})
			if err != nil || busy.Worker != "w0" {
				t.Fatalf("first request on %v (%v), want w0", busy, err)
			}
			l, err := s.Admit(context.Background(), Request{Model: "m", PromptTokens: 6000, Prefix: hashes})
			if err != nil {
				t.Fatal(err)
			}
			if l.Worker != tt.want {
				t.Errorf("long prompt on %s, want %s; record: %s", l.Worker, tt.want, l.Decision.Reason)
			}
		})
	}
}
