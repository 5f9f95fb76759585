package proxy

import (
	"bytes"
	"encoding/json"
)

// Typed stream events: the Anthropic Messages API's and OpenAI's
// Responses API's. Both name each event's type in its data ("type") as
// well as in the SSE event field; the data's is read, since that is what
// their SDKs dispatch on.

// anthropicEvent is what Sluice reads of one Messages stream event:
//
//	message_start        message.usage: input_tokens, cache_read_input_tokens,
//	                     cache_creation_input_tokens (the prompt)
//	content_block_delta  delta.text, .thinking or .partial_json: output
//	                     (the first one is the first token)
//	message_delta        usage.output_tokens (cumulative), and
//	                     input_tokens where the server repeats them
//	message_stop         the end of the answer
//	error                error: the worker failed mid-stream
//
// content_block_start, content_block_stop and ping carry nothing Sluice
// counts.
type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// anthropicUsage is Anthropic's usage object. input_tokens counts only the
// prompt tokens neither read from nor written to the cache.
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
}

// prompt is the whole prompt's size.
func (u *anthropicUsage) prompt() int {
	return max(u.InputTokens, 0) + max(u.CacheReadInputTokens, 0) + max(u.CacheCreationInputTokens, 0)
}

// readAnthropicEvent reads one Messages stream event's data.
func readAnthropicEvent(data []byte) eventInfo {
	var e anthropicEvent
	if json.Unmarshal(data, &e) != nil {
		return eventInfo{}
	}
	info := eventInfo{valid: true}
	switch e.Type {
	case "message_start":
		if e.Message != nil && e.Message.Usage != nil {
			info.prompt, info.usage = e.Message.Usage.prompt(), true
			if n := e.Message.Usage.CacheReadInputTokens; n > 0 {
				info.cached, info.cachedKnown = n, true
			}
		}
	case "content_block_delta":
		info.content = e.Delta != nil && (e.Delta.Text != "" || e.Delta.Thinking != "" || e.Delta.PartialJSON != "")
	case "message_delta":
		if e.Usage != nil {
			info.reported = e.Usage.OutputTokens
			if p := e.Usage.prompt(); p > 0 {
				info.prompt, info.usage = p, true
			}
		}
	case "message_stop":
		info.final = true
	case "error":
		info.err = string(bytes.TrimSpace(e.Error))
		if info.err == "" || info.err == "null" {
			info.err = string(data)
		}
	}
	return info
}

// responsesEvent is what Sluice reads of one Responses API stream event:
// the deltas of output text, reasoning, refusals and function-call
// arguments are output; response.completed and response.incomplete end
// the answer with its usage (input_tokens, output_tokens);
// response.failed and error fail it.
type responsesEvent struct {
	Type     string          `json:"type"`
	Delta    json.RawMessage `json:"delta"`
	Response *struct {
		Usage *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	} `json:"response"`
	Message string `json:"message"` // of an error event
}

// responsesDeltas are the event types whose delta is generated output.
var responsesDeltas = map[string]bool{
	"response.output_text.delta":             true,
	"response.reasoning_text.delta":          true,
	"response.reasoning_summary_text.delta":  true,
	"response.refusal.delta":                 true,
	"response.function_call_arguments.delta": true,
}

// readResponsesEvent reads one Responses stream event's data.
func readResponsesEvent(data []byte) eventInfo {
	var e responsesEvent
	if json.Unmarshal(data, &e) != nil {
		return eventInfo{}
	}
	info := eventInfo{valid: true}
	switch {
	case responsesDeltas[e.Type]:
		d := bytes.TrimSpace(e.Delta)
		info.content = len(d) > 2 && d[0] == '"' // a string, not ""
	case e.Type == "response.completed" || e.Type == "response.incomplete":
		info.final = true
		if e.Response != nil && e.Response.Usage != nil {
			info.reported = e.Response.Usage.OutputTokens
			info.prompt, info.usage = e.Response.Usage.InputTokens, true
		}
	case e.Type == "response.failed":
		info.err = "response.failed"
		if e.Response != nil && len(e.Response.Error) > 0 {
			info.err = string(e.Response.Error)
		}
	case e.Type == "error":
		info.err = string(data)
	}
	return info
}
