package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sluice-router/sluice/internal/prefix"
)

// The Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens), passed through to workers whose engine
// serves it: llama.cpp's llama-server, vLLM, SGLang and Ollama (see
// fleet.Unserved for the sources). Sluice reads what it needs to admit and
// meter the request, as for chat completions, and relays the body and the
// answer unchanged.

// messagesRequest is what Sluice reads of a Messages request body,
// decoded once: the prompt count, the prefix blocks and the session key
// all come from this one decode.
type messagesRequest struct {
	Model     *string                   `json:"model"`
	Stream    bool                      `json:"stream"`
	MaxTokens *int                      `json:"max_tokens"`
	System    prefix.AnthropicContent   `json:"system"`
	Messages  []prefix.AnthropicMessage `json:"messages"`
	Tools     []prefix.AnthropicTool    `json:"tools"`
	Metadata  *struct {
		UserID json.RawMessage `json:"user_id"`
	} `json:"metadata"`
}

// parseMessages validates a Messages request body (countTokens: a
// count_tokens body, which has no max_tokens). Its error is a
// *badRequest naming the field, in Anthropic's terms.
func parseMessages(body []byte, countTokens bool) (parsed, error) {
	var in messagesRequest
	if err := decodeBody(body, &in); err != nil {
		var bad *badRequest
		if errors.As(err, &bad) && (bad.param == "messages" || strings.HasPrefix(bad.param, "messages.")) {
			if err := checkMessages(rawMessages(body)).anthropic(); err != nil {
				return parsed{}, err // in Anthropic's words, with the message's index
			}
		}
		return parsed{}, err
	}
	var p parsed
	if in.Model != nil {
		p.model = *in.Model
	}
	if p.model == "" {
		return parsed{}, &badRequest{"model", `model: Field required (a string naming the model)`}
	}
	if in.Messages == nil {
		return parsed{}, msgFault{kind: faultMissing}.anthropic()
	}
	if !countTokens {
		switch {
		case in.MaxTokens == nil:
			return parsed{}, &badRequest{"max_tokens", `max_tokens: Field required (the most tokens to generate, at least 1)`}
		case *in.MaxTokens < 1:
			return parsed{}, &badRequest{"max_tokens", fmt.Sprintf("max_tokens: must be at least 1, got %d", *in.MaxTokens)}
		}
		p.maxTokens = *in.MaxTokens
	}
	if in.System.Bad != "" {
		return parsed{}, &badRequest{"system", "system: " + in.System.Bad}
	}
	if len(in.Messages) == 0 {
		return parsed{}, msgFault{kind: faultEmpty}.anthropic()
	}
	for i, m := range in.Messages {
		if m.Content.Bad != "" {
			return parsed{}, &badRequest{"messages", fmt.Sprintf("messages.%d.content: %s", i, m.Content.Bad)}
		}
		if m.Role == "" {
			// Absent, null, empty, or no message object at all.
			if err := checkMessages(rawMessages(body)).anthropic(); err != nil {
				return parsed{}, err
			}
			return parsed{}, msgFault{kind: faultNoRole, index: i}.anthropic()
		}
	}
	p.stream = in.Stream && !countTokens
	text, media := prefix.AnthropicText(in.System, in.Tools, in.Messages)
	p.prefix = prefix.Text(text, prefix.BlockBytes)
	pc := promptCount{runes: utf8.RuneCountInString(text), media: media, messages: len(in.Messages)}
	if len(in.System.Blocks) > 0 {
		pc.messages++ // the system prompt is one more message to the template
	}
	p.setPrompt(&pc)
	if in.Metadata != nil {
		p.metadataUserID = jsonString(in.Metadata.UserID)
	}
	return p, nil
}

// rawMessages is the messages of a body that decodes, as sent, for
// checkMessages: the request path reads them again only to say what is
// wrong with them.
func rawMessages(body []byte) json.RawMessage {
	var b struct {
		Messages json.RawMessage `json:"messages"`
	}
	json.Unmarshal(body, &b)
	return b.Messages
}

// jsonString is the value of raw when it is a JSON string, else "".
func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
