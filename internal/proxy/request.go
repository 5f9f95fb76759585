package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/sluice-router/sluice/internal/prefix"
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
	Messages            messagesField   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	N                   json.RawMessage `json:"n"`             // choices: a stream of more is never continued
	PromptEmbeds        present         `json:"prompt_embeds"` // vLLM: in place of a prompt
	Input               json.RawMessage `json:"input"`         // embeddings, /v1/responses
	Instructions        json.RawMessage `json:"instructions"`  // /v1/responses
	Query               json.RawMessage `json:"query"`         // rerank
	Documents           json.RawMessage `json:"documents"`     // rerank
	// Session keys (session.go), read only when they are strings: a
	// client sending another kind of value is the worker's to judge.
	PromptCacheKey json.RawMessage `json:"prompt_cache_key"`
	User           json.RawMessage `json:"user"`
	// The fields of a chat request that vLLM's /tokenize takes because
	// they change what the chat template renders (TokenizeChatRequest).
	Tools                json.RawMessage `json:"tools"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
}

// templateFields are the chat template's inputs beside the messages, in
// the order TokenizeInput.Template holds them.
var templateFields = []struct {
	name string
	get  func(*inference) json.RawMessage
}{
	{"tools", func(in *inference) json.RawMessage { return in.Tools }},
	{"chat_template", func(in *inference) json.RawMessage { return in.ChatTemplate }},
	{"chat_template_kwargs", func(in *inference) json.RawMessage { return in.ChatTemplateKwargs }},
	{"add_generation_prompt", func(in *inference) json.RawMessage { return in.AddGenerationPrompt }},
	{"continue_final_message", func(in *inference) json.RawMessage { return in.ContinueFinalMessage }},
	{"add_special_tokens", func(in *inference) json.RawMessage { return in.AddSpecialTokens }},
}

// messagesField is a request's `messages` as sent, for the prompt count,
// and decoded as prefix.FromBody decodes it, for the prefix blocks, in the
// same pass over the body. It never fails the body's decode: a chat
// request's messages of the wrong shape are refused after it
// (requireMessages), in words that name the message at fault; on the
// other routes they only cost the request its prefix blocks.
type messagesField struct {
	raw  json.RawMessage
	msgs []prefix.Message
	// bad is set when some occurrence of the field is not a list of
	// messages: prefix.FromBody finds no blocks in such a body.
	bad bool
}

// UnmarshalJSON keeps b and decodes it into f.msgs. A key repeated in the
// body calls it again: raw keeps the last value, as a json.RawMessage
// field would, and msgs is decoded into again, as the one decode of the
// whole body that prefix.FromBody makes would.
func (f *messagesField) UnmarshalJSON(b []byte) error {
	f.raw = append(f.raw[:0], b...)
	if json.Unmarshal(b, &f.msgs) != nil {
		f.bad = true
	}
	return nil
}

// parsed is a validated request.
type parsed struct {
	model        string
	stream       bool
	maxTokens    int
	promptTokens int
	promptRunes  int // characters of the prompt's text content
	promptExtra  int // tokens of the prompt that are not in its text
	// prefix is the prompt's chained block hashes (prefix.FromBody of
	// the body), where its prefix may be cached.
	prefix []uint64
	// messages is the body's messages as sent (valid ones only), and
	// prompt its prompt: what a worker's /tokenize is given for the
	// token blocks of KV events, and what a continuation extends.
	messages, prompt json.RawMessage
	// lastRole is the role of the last of valid messages; choices the
	// body's n as sent. A continuation reads them (canContinue).
	lastRole string
	choices  json.RawMessage
	// template is the body's chat-template fields beside its messages
	// (templateFields), for the same /tokenize.
	template []Field
	// proto is the request's API (protocolFor its path).
	proto *protocol
	// The body fields a session key may come from (session.go): OpenAI's
	// prompt_cache_key and user, Anthropic's metadata.user_id; "" when
	// absent or not a string.
	promptCacheKey, user, metadataUserID string
}

// badRequest is a request body Sluice refuses: what is wrong, in words a
// client's developer reads, and the field it is about (OpenAI's "param";
// empty for the body as a whole).
type badRequest struct {
	param, msg string
}

func (e *badRequest) Error() string { return e.msg }

// tokenLimits are the fields that bound a request's output, in the order
// they are read: the first positive one is the request's max_tokens.
// OpenAI's own fields must not be negative, as in OpenAI's API and vLLM
// (which refuses max_tokens under 1); llama.cpp's n_predict may be -1, its
// "no limit", which is its default. llama.cpp also reads a max_tokens of
// -1 as no limit, but a fleet that mixes engines would then answer the
// same request differently by where it lands, so on the OpenAI fields it
// is refused: leave the field out for no limit.
var tokenLimits = []struct {
	field string
	min   int
	get   func(*inference) *int
}{
	{"max_tokens", 0, func(in *inference) *int { return in.MaxTokens }},
	{"max_completion_tokens", 0, func(in *inference) *int { return in.MaxCompletionTokens }},
	{"n_predict", -1, func(in *inference) *int { return in.NPredict }},
	{"max_output_tokens", 0, func(in *inference) *int { return in.MaxOutputTokens }},
}

// parseInference validates an OpenAI-style body: its model (needModel is
// false for llama.cpp's native routes, which have none), its token
// limits, and what the route's check (nil for none) asks of the decoded
// body. Its error is a *badRequest.
func parseInference(body []byte, needModel bool, check func(*inference) error) (parsed, error) {
	var in inference
	if err := decodeBody(body, &in); err != nil {
		return parsed{}, err
	}
	var p parsed
	if in.Model != nil {
		p.model = *in.Model
	}
	if p.model == "" && needModel {
		return parsed{}, &badRequest{"model", `missing required field "model" (a string naming the model)`}
	}
	p.stream = in.Stream
	for _, tl := range tokenLimits {
		v := tl.get(&in)
		if v == nil {
			continue
		}
		if *v < tl.min {
			if tl.min == 0 {
				return parsed{}, &badRequest{tl.field, fmt.Sprintf("%q must not be negative, got %d (leave it out for no limit)", tl.field, *v)}
			}
			return parsed{}, &badRequest{tl.field, fmt.Sprintf("%q must be -1 (no limit) or more, got %d", tl.field, *v)}
		}
		if *v > 0 && p.maxTokens == 0 {
			p.maxTokens = *v
		}
	}
	if check != nil {
		if err := check(&in); err != nil {
			return parsed{}, err
		}
	}
	var pc promptCount
	for _, raw := range []json.RawMessage{in.Messages.raw, in.Prompt, in.Input, in.Instructions, in.Query, in.Documents} {
		pc.add(raw)
	}
	if !in.Messages.bad {
		p.prefix = prefix.FromMessages(in.Messages.msgs, in.Prompt, prefix.BlockBytes)
		if n := len(in.Messages.msgs); n > 0 {
			p.messages, p.lastRole = in.Messages.raw, in.Messages.msgs[n-1].Role
			for _, f := range templateFields {
				if v := f.get(&in); isSet(v) {
					p.template = append(p.template, Field{f.name, v})
				}
			}
		}
	}
	p.prompt, p.choices = in.Prompt, in.N
	p.setPrompt(&pc)
	p.promptCacheKey, p.user = jsonString(in.PromptCacheKey), jsonString(in.User)
	return p, nil
}

// decodeBody decodes a JSON object into in, saying in a client's words
// what is wrong when it cannot: not JSON at all, JSON but not an object,
// or a field Sluice reads holding the wrong kind of value. It is the one
// decode of the body. A body that starts as an object is not checked with
// json.Valid first: json.Unmarshal checks the whole of it before decoding.
func decodeBody(body []byte, in any) error {
	t := firstByte(body)
	if t == 0 {
		return &badRequest{"", "request body is empty: want a JSON object"}
	}
	if t != '{' {
		if !json.Valid(body) {
			return syntaxError(json.Unmarshal(body, new(json.RawMessage)))
		}
		return &badRequest{"", fmt.Sprintf("request body must be a JSON object ({...}), got %s", jsonKind(t))}
	}
	err := json.Unmarshal(body, in)
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return syntaxError(err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &badRequest{te.Field, fmt.Sprintf("%q must be %s, got %s", te.Field, wantJSON(te.Type), gotJSON(te.Value))}
	}
	if err != nil {
		return &badRequest{"", "request body could not be read as JSON: " + err.Error()}
	}
	return nil
}

// syntaxError is the refusal of a body that is not JSON; err is what
// json.Unmarshal said of it.
func syntaxError(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return &badRequest{"", fmt.Sprintf("request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)}
	}
	return &badRequest{"", "request body is not valid JSON"}
}

// firstByte is the first byte of body that is not JSON white space.
func firstByte(body []byte) byte {
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) > 0 {
		return b[0]
	}
	return 0
}

// jsonKind names the JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// wantJSON says what a field Sluice reads must hold, by its Go type.
func wantJSON(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another kind of value"
}

// gotJSON names what json.UnmarshalTypeError saw: "string", "bool", or
// "number 5.5" for a number that does not fit.
func gotJSON(v string) string {
	switch v {
	case "array", "object":
		return "an " + v
	case "bool":
		return "a boolean"
	case "string", "number":
		return "a " + v
	}
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	return v
}

// Prompt size estimates. Four characters per token is about right for
// English BPE vocabularies, and is where a model starts: once workers
// have counted some of its prompts, the characters are scaled by what
// they counted instead (tokenRatio).
const (
	charsPerToken = 4
	// mediaTokens stands for one image, audio clip or file part: what it
	// costs depends on the model's encoder, and its base64 bytes say
	// nothing about it.
	mediaTokens = 256
	// messageTokens is the chat template's overhead per message (role
	// markers, separators).
	messageTokens = 4
)

// setPrompt sets p's prompt size, and what the calibration refines
// it from, to c's estimate.
func (p *parsed) setPrompt(c *promptCount) {
	p.promptTokens = max(c.tokens(), 1)
	p.promptRunes = c.runes
	p.promptExtra = c.tokens() - c.runes/charsPerToken
}

// promptCount estimates a prompt's tokens from its text content only:
// strings of messages' content (plain or text parts), prompts, inputs and
// documents. JSON syntax, roles and part types count nothing; an image or
// audio part, or any data: URL, counts mediaTokens; a number in a prompt
// array is a token id and counts one.
type promptCount struct {
	runes, ids, media, messages int
}

func (c *promptCount) tokens() int {
	return c.runes/charsPerToken + c.ids + c.media*mediaTokens + c.messages*messageTokens
}

// add counts raw, a JSON value of the body as the body's decode kept it
// (so valid JSON): a list of message objects counts messageTokens each,
// and its text is counted by walkJSON.
func (c *promptCount) add(raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var elems []json.RawMessage
	if firstByte(raw) == '[' && json.Unmarshal(raw, &elems) == nil && len(elems) > 0 && firstByte(elems[0]) == '{' {
		c.messages += len(elems)
	}
	c.walkJSON(raw)
}

// nonText are keys whose values are not prompt text.
var nonText = map[string]bool{"type": true, "role": true, "id": true, "tool_call_id": true, "detail": true, "format": true, "cache_control": true}

// mediaTypes are the content part types that carry media, not text.
var mediaTypes = map[string]bool{"image_url": true, "input_image": true, "image": true, "input_audio": true, "audio": true, "file": true, "input_file": true, "video_url": true}
