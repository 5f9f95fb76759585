package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/sluice-router/sluice/internal/sse"
)

// chunk is what one server-sent event of an OpenAI chat completion stream
// told us.
type chunk struct {
	// Content is true when the event carried generated text (content or
	// reasoning_content), i.e. at least one token.
	Content bool
	// Usage is the completion token count from a usage object, or -1.
	Usage int
	// Cached is the prompt tokens the worker served from its prefix
	// cache (usage.prompt_tokens_details.cached_tokens, else llama.cpp's
	// timings.cache_n), or -1 when the event says nothing of it.
	Cached int
	// Err is the message of an error event.
	Err string
	// Done marks the final "data: [DONE]".
	Done bool
}

// completion is the subset of an OpenAI chat completion (streamed chunk or
// whole response) the runner reads.
type completion struct {
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	// Timings is llama.cpp's; cache_n is the prompt tokens it reused.
	Timings *struct {
		CacheN int `json:"cache_n"`
	} `json:"timings"`
	Error json.RawMessage `json:"error"`
}

// cached returns the prompt tokens the worker served from its prefix
// cache, as OpenAI's usage.prompt_tokens_details.cached_tokens or, failing
// that, llama.cpp's timings.cache_n say; -1 when neither is there.
func (c *completion) cached() int {
	if c.Usage != nil && c.Usage.PromptTokensDetails != nil {
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	if c.Timings != nil {
		return c.Timings.CacheN
	}
	return -1
}

// errorMessage extracts a message from an OpenAI-shaped error value, which
// is an object with "message" or (from some servers) a bare string.
func errorMessage(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Message != "" {
		return obj.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	return truncate(string(raw), 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// decodeChunk interprets one event's data.
func decodeChunk(data []byte) (chunk, error) {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return chunk{Done: true, Usage: -1, Cached: -1}, nil
	}
	var c completion
	if err := json.Unmarshal(data, &c); err != nil {
		return chunk{}, fmt.Errorf("stream chunk %q: %w", truncate(string(data), 80), err)
	}
	out := chunk{Usage: -1, Cached: -1, Err: errorMessage(c.Error)}
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" || ch.Text != "" || ch.Message.Content != "" {
			out.Content = true
		}
	}
	if c.Usage != nil {
		out.Usage = c.Usage.CompletionTokens
	}
	out.Cached = c.cached()
	return out, nil
}

// readSSE reads a text/event-stream body and calls fn with each data event
// as it is dispatched (at the blank line that ends it, or at EOF), so the
// caller can time the first token. It stops after [DONE], at EOF, or when
// fn returns an error. Events are split by sse.Parser, the parser the
// router's relay uses: comments, ids and event names are ignored, and
// several data lines of one event are joined with newlines.
func readSSE(r io.Reader, fn func(chunk) error) error {
	p := sse.Parser{Max: 4 << 20}
	var stop bool
	var err error
	event := func(e sse.Event) {
		if stop {
			return
		}
		var c chunk
		if c, err = decodeChunk(e.Data); err == nil {
			err = fn(c)
		}
		stop = err != nil || c.Done
	}
	buf := make([]byte, 16<<10)
	for !stop {
		n, rerr := r.Read(buf)
		p.Feed(buf[:n], event)
		if stop {
			break
		}
		if rerr == io.EOF {
			p.End(event)
			break
		}
		if rerr != nil {
			return fmt.Errorf("read stream: %w", rerr)
		}
	}
	if err == nil && p.Dropped > 0 {
		return fmt.Errorf("read stream: a line or event over %d bytes", p.Max)
	}
	return err
}

// errStreamEnded is returned when a stream ends with neither [DONE] nor
// any data.
var errStreamEnded = errors.New("stream ended without data")
