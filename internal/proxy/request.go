package proxy

import (
	"encoding/json"
	"fmt"
	"strings"
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
	promptText   string // the prompt's text content, for the worker's /tokenize
	promptRunes  int    // characters of that text (all of it, past maxPromptText too)
	promptExtra  int    // tokens of the prompt that are not in promptText
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
	var pc promptCount
	for _, raw := range []json.RawMessage{in.Messages, in.Prompt, in.Input, in.Instructions, in.Query, in.Documents} {
		pc.add(raw)
	}
	p.promptTokens = max(pc.tokens(), 1)
	p.promptText = pc.text.String()
	p.promptRunes = pc.runes
	p.promptExtra = pc.tokens() - pc.runes/charsPerToken
	return p, nil
}

// Prompt size estimates. Four characters per token is about right for
// English BPE vocabularies, and is where a model starts: once workers
// have counted some of its prompts, the characters are scaled by what
// they counted instead (tokenRatio), and a worker's /tokenize may count
// large prompts exactly (Options.Tokenize).
const (
	charsPerToken = 4
	// mediaTokens stands for one image, audio clip or file part: what it
	// costs depends on the model's encoder, and its base64 bytes say
	// nothing about it.
	mediaTokens = 256
	// messageTokens is the chat template's overhead per message (role
	// markers, separators).
	messageTokens = 4
	// maxPromptText bounds the prompt text kept for the worker's
	// /tokenize.
	maxPromptText = 1 << 20
)

// promptCount estimates a prompt's tokens from its text content only:
// strings of messages' content (plain or text parts), prompts, inputs and
// documents. JSON syntax, roles and part types count nothing; an image or
// audio part, or any data: URL, counts mediaTokens; a number in a prompt
// array is a token id and counts one.
type promptCount struct {
	runes, ids, media, messages int
	text                        strings.Builder // the text, for /tokenize
}

func (c *promptCount) tokens() int {
	return c.runes/charsPerToken + c.ids + c.media*mediaTokens + c.messages*messageTokens
}

func (c *promptCount) add(raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return
	}
	if msgs, ok := v.([]any); ok && len(msgs) > 0 {
		if _, isObj := msgs[0].(map[string]any); isObj {
			c.messages += len(msgs)
		}
	}
	c.walk(v)
}

// nonText are keys whose values are not prompt text.
var nonText = map[string]bool{"type": true, "role": true, "id": true, "tool_call_id": true, "detail": true, "format": true, "cache_control": true}

// mediaTypes are the content part types that carry media, not text.
var mediaTypes = map[string]bool{"image_url": true, "input_image": true, "image": true, "input_audio": true, "audio": true, "file": true, "input_file": true, "video_url": true}

func (c *promptCount) walk(v any) {
	switch x := v.(type) {
	case string:
		if strings.HasPrefix(x, "data:") {
			c.media++
			return
		}
		c.runes += utf8.RuneCountInString(x)
		if c.text.Len() < maxPromptText {
			if c.text.Len() > 0 {
				c.text.WriteByte('\n')
			}
			c.text.WriteString(x)
		}
	case float64:
		c.ids++
	case []any:
		for _, e := range x {
			c.walk(e)
		}
	case map[string]any:
		if t, ok := x["type"].(string); ok && mediaTypes[t] {
			c.media++
			return
		}
		for k, e := range x {
			if !nonText[k] {
				c.walk(e)
			}
		}
	}
}
