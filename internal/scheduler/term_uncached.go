package scheduler

import (
	"math"
	"time"
)

// uncachedPrompt is the prompt the worker would have to prefill: the
// request's prompt tokens not expected in its KV cache, prompt × (1 −
// prefix match), as a fraction of the largest among the candidates (0
// when none has any to prefill).
//
// The prefix term rewards a match as a share of the prefix, the same for
// a 100-token prompt as for a 10,000-token one, while the prefill a match
// saves, and the stall it spares the streams already running there, grow
// with the prompt. This term weighs the tokens themselves, so for long
// prompts (code assistants, RAG, long conversations) a cached prefix
// counts for as much as it saves. Off by default (weight 0: it is left
// out of the score); weights.uncached_prompt turns it on.
type uncachedPrompt struct{}

func (uncachedPrompt) Name() string { return "uncached_prompt" }
func (uncachedPrompt) Reward() bool { return false }
func (uncachedPrompt) Score(env *Env, c []Candidate, raw, norm []float64) {
	prompt := 0.0
	if env != nil && env.Req != nil {
		prompt = float64(max(env.Req.PromptTokens, 0))
	}
	maxv := 0.0
	for i := range c {
		raw[i] = math.Round(prompt * (1 - clamp01(c[i].PrefixMatch)))
		maxv = max(maxv, raw[i])
	}
	for i := range c {
		norm[i] = 0
		if maxv > 0 {
			norm[i] = raw[i] / maxv
		}
	}
}
func (uncachedPrompt) Provenance(_ *Env, c *Candidate) (string, time.Time, bool) {
	if c.PrefixSource == "" {
		return "prompt tokens (no prefix known: all to prefill)", time.Time{}, false
	}
	return "prompt tokens × (1 − prefix match per " + c.PrefixSource + ")", time.Time{}, false
}
