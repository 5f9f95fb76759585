package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/sluice-router/sluice/internal/sse"
)

// ErrStreamTruncated is why a stream that ended cleanly is still a
// failure: it ended before its terminator ([DONE], a final chunk with a
// finish_reason, or llama.cpp's "stop": true), so the client did not get
// the whole answer.
var ErrStreamTruncated = errors.New("the worker's stream ended before its terminator ([DONE], a finish_reason or stop)")

// chunk is what Sluice reads of one streamed event or a whole answer:
// content to count tokens, usage when the worker reports it, errors, and
// what a continuable stream follows (the id, the text, whether a tool
// call or reasoning began).
type chunk struct {
	ID      json.RawMessage `json:"id"`
	Choices []struct {
		Delta struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Content *string `json:"content"` // llama.cpp native /completion
	// Stop marks llama.cpp's native /completion final event, which is
	// not followed by [DONE].
	Stop  bool `json:"stop"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		// Anthropic's Messages and OpenAI's Responses answers say
		// input_tokens and output_tokens; Anthropic's input_tokens leaves
		// out the cached part, which it states beside.
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		// The prompt tokens the engine found in its cache: OpenAI's
		// chat and completions (vLLM, SGLang) say it in
		// prompt_tokens_details, the Responses API in
		// input_tokens_details.
		PromptTokensDetails *cachedDetails `json:"prompt_tokens_details"`
		InputTokensDetails  *cachedDetails `json:"input_tokens_details"`
	} `json:"usage"`
	TokensPredicted int             `json:"tokens_predicted"` // llama.cpp native
	Timings         *timings        `json:"timings"`
	Error           json.RawMessage `json:"error"`
}

// eventInfo is what the relay takes from one streamed event's data.
type eventInfo struct {
	valid    bool   // the data decodes as a chunk
	err      string // the worker's non-null "error" value, as it sent it
	content  bool   // it carries generated text
	final    bool   // it ends the answer (finish_reason, or native stop)
	reported int    // output tokens the worker states, or 0 (may be negative: not believed)
	prompt   int    // prompt tokens the worker states, or 0
	// cached is how many of them the worker says it found in its cache,
	// when it says (cachedKnown).
	cached      int
	cachedKnown bool
	usage       bool // it carries a usage object, whose prompt count has the last word

	// What a continuable stream follows (contStream.follow): the
	// event's id when it is a string, the text it carries (content,
	// then each choice's delta.content and text, in order), and whether
	// a tool call or reasoning text began in it.
	id, text        string
	tool, reasoning bool
}

// readEvent reads one OpenAI-style event's data (or llama.cpp's native
// one) by decoding it into a chunk.
func readEvent(data []byte) eventInfo {
	var c chunk
	if json.Unmarshal(data, &c) != nil {
		return eventInfo{}
	}
	if isSet(c.Error) {
		return eventInfo{valid: true, err: string(c.Error)}
	}
	info := eventInfo{
		valid:    true,
		content:  c.hasContent(),
		final:    c.final(),
		reported: c.reportedTokens(),
		prompt:   c.promptCount(),
		usage:    c.Usage != nil,
	}
	info.cached, info.cachedKnown = c.cachedCount()
	json.Unmarshal(c.ID, &info.id) // a string, else none
	var text strings.Builder
	if c.Content != nil {
		text.WriteString(*c.Content)
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		info.tool = info.tool || isSet(d.ToolCalls) || isSet(d.FunctionCall)
		info.reasoning = info.reasoning || d.ReasoningContent != nil && *d.ReasoningContent != ""
		for _, s := range []*string{d.Content, ch.Text} {
			if s != nil {
				text.WriteString(*s)
			}
		}
	}
	info.text = text.String()
	return info
}

// isSet reports whether a JSON value is present and not null.
func isSet(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// timings is llama.cpp's per-request timing object, in milliseconds of
// the worker's own clock: prompt_ms is prefill, predicted_ms the decode of
// predicted_n tokens.
type timings struct {
	PromptN            int     `json:"prompt_n"` // prompt tokens evaluated
	CacheN             int     `json:"cache_n"`  // prompt tokens reused from the cache
	PromptMs           float64 `json:"prompt_ms"`
	PredictedN         int     `json:"predicted_n"`
	PredictedMs        float64 `json:"predicted_ms"`
	PredictedPerSecond float64 `json:"predicted_per_second"`
}

// hasContent reports whether the chunk carries generated text.
func (c *chunk) hasContent() bool {
	if c.Content != nil && *c.Content != "" {
		return true
	}
	for _, ch := range c.Choices {
		for _, s := range []*string{ch.Delta.Content, ch.Delta.ReasoningContent, ch.Text} {
			if s != nil && *s != "" {
				return true
			}
		}
	}
	return false
}

// final reports whether the chunk ends the answer: a choice with a
// finish_reason, or llama.cpp's native "stop": true.
func (c *chunk) final() bool {
	if c.Stop {
		return true
	}
	for _, ch := range c.Choices {
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			return true
		}
	}
	return false
}

// cachedDetails is the part of usage's token details that says how many
// prompt tokens came from the engine's prefix cache.
type cachedDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

// cachedCount returns how many prompt tokens the worker says it found in
// its prefix cache, and whether it said: usage's prompt_tokens_details
// (or input_tokens_details).cached_tokens, else Anthropic's
// cache_read_input_tokens when there are any, else llama.cpp's
// timings.cache_n.
func (c *chunk) cachedCount() (int, bool) {
	if u := c.Usage; u != nil {
		for _, d := range []*cachedDetails{u.PromptTokensDetails, u.InputTokensDetails} {
			if d != nil && d.CachedTokens != nil {
				return max(*d.CachedTokens, 0), true
			}
		}
		if u.CacheReadInputTokens > 0 {
			return u.CacheReadInputTokens, true
		}
	}
	if c.Timings != nil {
		return max(c.Timings.CacheN, 0), true
	}
	return 0, false
}

// promptCount returns the prompt size the worker states, or 0: usage's
// prompt_tokens, else llama.cpp's timings prompt_n + cache_n (a stream
// carries usage only when the request asked for it), else the
// n_prompt_tokens of llama.cpp's exceed_context_size_error.
func (c *chunk) promptCount() int {
	switch {
	case c.Usage != nil && c.Usage.PromptTokens > 0:
		return c.Usage.PromptTokens
	case c.Usage != nil && c.Usage.InputTokens+c.Usage.CacheReadInputTokens+c.Usage.CacheCreationInputTokens > 0:
		return max(c.Usage.InputTokens, 0) + max(c.Usage.CacheReadInputTokens, 0) + max(c.Usage.CacheCreationInputTokens, 0)
	case c.Timings != nil && c.Timings.PromptN+c.Timings.CacheN > 0:
		return max(c.Timings.PromptN, 0) + max(c.Timings.CacheN, 0)
	case len(c.Error) > 0:
		var e struct {
			NPromptTokens int `json:"n_prompt_tokens"`
		}
		if json.Unmarshal(c.Error, &e) == nil && e.NPromptTokens > 0 {
			return e.NPromptTokens
		}
	}
	return 0
}

// reportedTokens returns the output token count the worker states, or 0.
func (c *chunk) reportedTokens() int {
	switch {
	case c.Usage != nil && c.Usage.CompletionTokens > 0:
		return c.Usage.CompletionTokens
	case c.Usage != nil && c.Usage.OutputTokens > 0:
		return c.Usage.OutputTokens
	case c.Timings != nil && c.Timings.PredictedN > 0:
		return c.Timings.PredictedN
	}
	return c.TokensPredicted
}

// streamMeter follows an SSE stream event by event, through the one SSE
// parser (package sse) fed the bytes the relay forwards.
type streamMeter struct {
	read func(data []byte) eventInfo // protocol.read

	parser   sse.Parser
	content  int // events that carried generated text
	reported int // tokens the worker reported, if any
	prompt   int // prompt tokens the worker reported, if any
	// cached is the prompt tokens the worker said it found cached, when
	// it said (cachedKnown).
	cached      int
	cachedKnown bool
	done        bool // saw data: [DONE]
	finished    bool // saw a final chunk (finish_reason, or native stop)
	failed      bool // the worker sent an error event
	failure     string
	first       bool // the last feed or end held the stream's first content
}

// end ends the stream (see sse.Parser.End); first then says whether what
// was pending held its first content.
func (m *streamMeter) end() {
	m.first = false
	m.parser.End(func(e sse.Event) { m.take(e) })
}

// take reads one dispatched event, and returns what it read of the data
// for a relay that follows the event too, so that an event is decoded
// once. An event named "error", or whose data holds an "error" that is
// not null, fails the stream, unless it comes after the stream's end (see
// complete); data that is not a chunk counts for nothing.
func (m *streamMeter) take(e sse.Event) eventInfo {
	data := bytes.TrimSpace(e.Data)
	ended := m.complete() // an error after the end fails nothing
	if string(e.Type) == "error" && !ended {
		m.failed = true
		if m.failure == "" {
			m.failure = string(data)
		}
	}
	if string(data) == "[DONE]" {
		m.done = true
		return eventInfo{}
	}
	c := m.read(data)
	switch {
	case !c.valid:
		return c
	case c.err != "":
		if !ended {
			m.failed, m.failure = true, c.err
		}
		return c
	}
	if c.reported > 0 {
		m.reported = c.reported
	}
	if c.prompt > 0 && (m.prompt == 0 || c.usage) {
		m.prompt = c.prompt // usage, where it comes, has the last word
	}
	if c.cachedKnown {
		m.cached, m.cachedKnown = c.cached, true
	}
	if c.final {
		m.finished = true
	}
	if c.content {
		m.content++
		m.first = m.first || m.content == 1
	}
	return c
}

// complete reports whether the stream delivered its end: [DONE], or a
// final chunk (whatever follows it, usage or [DONE], adds nothing the
// client needs), and no error event.
func (m *streamMeter) complete() bool { return (m.done || m.finished) && !m.failed }

// tokens is the output token count: what the worker reported, else the
// number of content events (servers send one token per event).
func (m *streamMeter) tokens() int {
	if m.reported > 0 {
		return m.reported
	}
	return m.content
}
