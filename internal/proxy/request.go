package proxy

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// inference is what Sluice reads of an inference request body. Everything
// else in the body is passed to the worker untouched.
type inference struct {
	Model               *string         `json:"model"`
	Stream              bool            `json:"stream"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	NPredict            *int            `json:"n_predict"`         // llama.cpp native
	MaxOutputTokens     *int            `json:"max_output_tokens"` // /v1/responses
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`        // embeddings, /v1/responses
	Instructions        json.RawMessage `json:"instructions"` // /v1/responses
	Query               json.RawMessage `json:"query"`        // rerank
	Documents           json.RawMessage `json:"documents"`    // rerank
}

// parsed is a validated request.
type parsed struct {
	model        string
	stream       bool
	maxTokens    int
	promptTokens int
}

// parseInference validates body. needModel is false for llama.cpp's native
// /completion, which has no model field.
func parseInference(body []byte, needModel bool) (parsed, error) {
	var in inference
	if err := json.Unmarshal(body, &in); err != nil {
		return parsed{}, fmt.Errorf("request body is not valid JSON: %v", err)
	}
	var p parsed
	if in.Model != nil {
		p.model = *in.Model
	}
	if p.model == "" && needModel {
		return parsed{}, fmt.Errorf("missing required field \"model\"")
	}
	p.stream = in.Stream
	for _, v := range []*int{in.MaxTokens, in.MaxCompletionTokens, in.NPredict, in.MaxOutputTokens} {
		if v == nil {
			continue
		}
		if *v < -1 {
			return parsed{}, fmt.Errorf("max_tokens must not be negative, got %d", *v)
		}
		if *v > 0 {
			p.maxTokens = *v
			break
		}
	}
	p.promptTokens = estimateTokens(in.Messages) + estimateTokens(in.Prompt) + estimateTokens(in.Input) +
		estimateTokens(in.Instructions) + estimateTokens(in.Query) + estimateTokens(in.Documents)
	p.promptTokens = max(p.promptTokens, 1)
	return p, nil
}

// estimateTokens guesses the token count of a JSON value's text: about
// four characters per token for English BPE vocabularies. The scheduler
// only needs relative sizes, and the true count is the worker's business.
func estimateTokens(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	return utf8.RuneCount(raw) / 4
}
