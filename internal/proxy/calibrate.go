package proxy

import (
	"fmt"
	"math"
	"sync"
)

// Calibration of the prompt estimate. Four characters a token is right for
// English under GPT-style BPE vocabularies and far off elsewhere (code,
// other languages, other tokenizers), enough for the context check to let
// a prompt through to a slot too small for it. Workers say what they
// counted (usage.prompt_tokens, llama.cpp's timings prompt_n + cache_n,
// and the n_prompt_tokens of the 400 a prompt too long for its slot
// gets), so the estimate learns, per model, how many tokens a character
// of prompt text is worth.
const (
	// calibrationAlpha is the weight of the newest ratio in the moving
	// average: a model's tokenizer does not change, but prompts differ
	// (prose, code, other languages), and the average follows the mix.
	calibrationAlpha = 0.2
	// calibrationMinRunes is the least text a sample must have: on a
	// short prompt the chat template's own tokens, which the estimate
	// only guesses (messageTokens), would swamp the ratio.
	calibrationMinRunes = 200
	// calibrationMinRatio and calibrationMaxRatio bound a believable
	// sample, in tokens per character: below, the worker counted less
	// than one token in twenty characters; above, two tokens a character
	// (CJK text runs near one).
	calibrationMinRatio = 0.05
	calibrationMaxRatio = 2.0
	// calibrationMaxModels bounds the models remembered.
	calibrationMaxModels = 1024
)

// SourceCalibrated is the PromptSource of an estimate scaled by what
// workers counted for the model's earlier prompts; the record's text adds
// the ratio in use.
const SourceCalibrated = "estimate: text × tokens/char from worker usage"

// tokenRatio keeps, per model, the moving average of tokens per character
// of prompt text that workers reported. It is the only owner of that
// state; its methods are safe for concurrent use.
type tokenRatio struct {
	mu      sync.Mutex
	byModel map[string]ratioEMA
}

// ratioEMA is one model's average and its sample count.
type ratioEMA struct {
	value float64
	n     int
}

func newTokenRatio() *tokenRatio { return &tokenRatio{byModel: map[string]ratioEMA{}} }

// estimate returns p's prompt size scaled by the model's learned ratio,
// and the record's source text; ok is false until the model has one, and
// for a prompt without text.
func (t *tokenRatio) estimate(p parsed) (tokens int, source string, ok bool) {
	if p.promptRunes == 0 {
		return 0, "", false
	}
	t.mu.Lock()
	e, have := t.byModel[p.model]
	t.mu.Unlock()
	if !have {
		return 0, "", false
	}
	n := int(math.Ceil(float64(p.promptRunes)*e.value)) + p.promptExtra
	return max(n, 1), fmt.Sprintf("%s (%.3f, %d samples)", SourceCalibrated, e.value, e.n), true
}

// observe learns from a worker's count of p's prompt: the tokens beyond
// what the estimate puts on the non-text parts (messages, media, token
// ids) over the characters of text. Short prompts and unbelievable ratios
// teach nothing.
func (t *tokenRatio) observe(p parsed, counted int) {
	if p.promptRunes < calibrationMinRunes || counted <= p.promptExtra {
		return
	}
	r := float64(counted-p.promptExtra) / float64(p.promptRunes)
	if r < calibrationMinRatio || r > calibrationMaxRatio {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, have := t.byModel[p.model]
	switch {
	case have:
		e.value += calibrationAlpha * (r - e.value)
	case len(t.byModel) >= calibrationMaxModels:
		return
	default:
		e.value = r
	}
	e.n++
	t.byModel[p.model] = e
}
