package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/sluice-router/sluice/internal/prefix"
)

// The simulator serves every route Sluice routes, so that a client SDK's
// calls can be tried end to end against it: besides chat completions,
// completions and llama.cpp's /completion, the Anthropic Messages API
// (/v1/messages, /v1/messages/count_tokens) and OpenAI's Responses API
// (/v1/responses), in the shapes llama-server answers them (its
// tools/server/server-task.cpp): typed SSE events ("event:" and "data:"
// lines), no [DONE], and the usage of each.

// typedRequest is the union of what the simulator reads of a Messages or
// Responses request.
type typedRequest struct {
	Stream          bool                      `json:"stream"`
	MaxTokens       *int                      `json:"max_tokens"`        // messages
	MaxOutputTokens *int                      `json:"max_output_tokens"` // responses
	System          prefix.AnthropicContent   `json:"system"`
	Messages        []prefix.AnthropicMessage `json:"messages"`
	Tools           []prefix.AnthropicTool    `json:"tools"`
	Input           json.RawMessage           `json:"input"`
	Instructions    json.RawMessage           `json:"instructions"`
	IgnoreEOS       bool                      `json:"ignore_eos"`
	SimPromptTokens *int                      `json:"sim_prompt_tokens"`
}

// parseTypedRequest reads a Messages or Responses request. A Messages
// prompt is cut into the router's blocks of its canonical rendering
// (prefix.RenderAnthropic), so the router's guess of this worker's cache
// is in the same blocks; a Responses prompt is sized by its text only.
func parseTypedRequest(kind genKind, body io.Reader) (genRequest, error) {
	var tr typedRequest
	if err := json.NewDecoder(body).Decode(&tr); err != nil {
		return genRequest{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	g := genRequest{kind: kind, stream: tr.Stream, req: Request{IgnoreEOS: tr.IgnoreEOS}}
	var limit *int
	switch kind {
	case kindMessages:
		if tr.Messages == nil {
			return genRequest{}, errors.New("messages: Field required")
		}
		if tr.MaxTokens == nil || *tr.MaxTokens < 1 {
			return genRequest{}, errors.New("max_tokens: must be at least 1")
		}
		limit = tr.MaxTokens
		text, _ := prefix.AnthropicText(tr.System, tr.Tools, tr.Messages)
		g.req.PromptTokens = estimateTokens(len(text))
		g.req.Prefix, g.req.PrefixBlockTokens = prefix.Text(text, prefix.BlockBytes), prefix.BlockTokens
		g.req.Text = simBOS + text
		g.ans = answerTo(text) // deterministic, as on the other routes (text.go)
	default:
		if len(tr.Input) == 0 {
			return genRequest{}, errors.New("'input' is required")
		}
		limit = tr.MaxOutputTokens
		g.req.PromptTokens = estimateTokens(textChars(tr.Input) + textChars(tr.Instructions))
		g.ans = answerTo(string(tr.Input) + string(tr.Instructions))
	}
	if tr.SimPromptTokens != nil {
		if *tr.SimPromptTokens < 1 {
			return genRequest{}, errors.New("'sim_prompt_tokens' must be at least 1")
		}
		g.req.PromptTokens = *tr.SimPromptTokens
		g.req.Prefix, g.req.PrefixBlockTokens, g.req.Text = nil, 0, ""
	}
	if limit != nil {
		if *limit < 1 {
			return genRequest{}, fmt.Errorf("token limit must be at least 1, got %d", *limit)
		}
		g.req.MaxTokens = *limit
	}
	return g, nil
}

// textChars counts the bytes of the strings in a JSON value.
func textChars(raw json.RawMessage) int {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return 0
	}
	var walk func(any) int
	walk = func(v any) int {
		switch x := v.(type) {
		case string:
			return len(x)
		case []any:
			n := 0
			for _, e := range x {
				n += walk(e)
			}
			return n
		case map[string]any:
			n := 0
			for k, e := range x {
				if k != "type" && k != "role" {
					n += walk(e)
				}
			}
			return n
		}
		return 0
	}
	return walk(v)
}

// handleCountTokens answers /v1/messages/count_tokens as llama-server
// does: {"input_tokens": N}.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var tr typedRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&tr); err != nil || tr.Messages == nil {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "messages: Field required")
		return
	}
	text, _ := prefix.AnthropicText(tr.System, tr.Tools, tr.Messages)
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": estimateTokens(len(text))})
}

// errorWriter answers errors in kind's API shape.
func errorWriter(kind genKind) func(w http.ResponseWriter, status int, typ, msg string) {
	if kind == kindMessages {
		return writeAnthropicError
	}
	return writeError
}

// writeAnthropicError writes Anthropic's error shape.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	if typ != "invalid_request_error" && status == http.StatusBadRequest {
		typ = "invalid_request_error" // llama.cpp's exceed_context_size_error, in Anthropic's words
	}
	if status == http.StatusServiceUnavailable {
		typ = "overloaded_error"
	}
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// writeTyped writes one typed event.
func writeTyped(buf *bytes.Buffer, typ string, v any) {
	buf.WriteString("event: ")
	buf.WriteString(typ)
	buf.WriteString("\ndata: ")
	b, _ := json.Marshal(v)
	buf.Write(b)
	buf.WriteString("\n\n")
}

// writeStart writes the events that open a stream, before its first token.
func (o *responder) writeStart(buf *bytes.Buffer) {
	switch o.g.kind {
	case kindMessages:
		writeTyped(buf, "message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": o.msgID(), "type": "message", "role": "assistant", "content": []any{}, "model": o.s.p.Model,
			"stop_reason": nil, "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": o.g.req.PromptTokens, "output_tokens": 0},
		}})
		writeTyped(buf, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
		writeTyped(buf, "ping", map[string]string{"type": "ping"})
	case kindResponses:
		r := o.responseObject("in_progress", nil, nil)
		writeTyped(buf, "response.created", map[string]any{"type": "response.created", "response": r})
		writeTyped(buf, "response.in_progress", map[string]any{"type": "response.in_progress", "response": r})
	}
}

// writeChunk writes the event of token n.
func (o *responder) writeChunk(buf *bytes.Buffer, n int) {
	text := o.g.ans.token(o.g.skip + n)
	switch o.g.kind {
	case kindMessages:
		writeTyped(buf, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": text}})
	case kindResponses:
		writeTyped(buf, "response.output_text.delta", map[string]any{"type": "response.output_text.delta", "item_id": o.itemID(), "output_index": 0, "content_index": 0, "delta": text})
	default:
		writeEvent(buf, o.chunk(n))
	}
}

// writeEnd writes the events that end a stream.
func (o *responder) writeEnd(buf *bytes.Buffer, n int, res Result) {
	switch o.g.kind {
	case kindMessages:
		writeTyped(buf, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		writeTyped(buf, "message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": stopReason(res), "stop_sequence": nil}, "usage": anthropicUsage(res)})
		writeTyped(buf, "message_stop", map[string]string{"type": "message_stop"})
	case kindResponses:
		writeTyped(buf, "response.completed", map[string]any{"type": "response.completed", "response": o.response(n, res)})
	case kindNative:
		writeEvent(buf, o.lastChunk(n, res))
	default:
		writeEvent(buf, o.lastChunk(n, res))
		buf.WriteString("data: [DONE]\n\n")
	}
}

func (o *responder) msgID() string  { return fmt.Sprintf("msg_sim%d", o.id) }
func (o *responder) itemID() string { return fmt.Sprintf("msg_sim%d_0", o.id) }

// anthropicUsage is Anthropic's usage: input_tokens net of the cache.
func anthropicUsage(res Result) map[string]int {
	return map[string]int{"input_tokens": res.PromptTokens - res.CachedTokens, "cache_read_input_tokens": res.CachedTokens, "output_tokens": res.CompletionTokens}
}

func stopReason(res Result) string {
	if res.FinishReason == FinishLength {
		return "max_tokens"
	}
	return "end_turn"
}

// message is the whole Messages answer.
func (o *responder) message(n int, res Result) map[string]any {
	return map[string]any{
		"id": o.msgID(), "type": "message", "role": "assistant", "model": o.s.p.Model,
		"content":     []any{map[string]string{"type": "text", "text": o.text(n)}},
		"stop_reason": stopReason(res), "stop_sequence": nil, "usage": anthropicUsage(res),
	}
}

// response is the whole Responses answer.
func (o *responder) response(n int, res Result) map[string]any {
	out := []any{map[string]any{"type": "message", "id": o.itemID(), "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": o.text(n), "annotations": []any{}}}}}
	usage := map[string]any{"input_tokens": res.PromptTokens, "output_tokens": res.CompletionTokens, "total_tokens": res.PromptTokens + res.CompletionTokens,
		"input_tokens_details": map[string]int{"cached_tokens": res.CachedTokens}}
	status := "completed"
	if res.FinishReason == FinishLength {
		status = "incomplete"
	}
	return o.responseObject(status, out, usage)
}

func (o *responder) responseObject(status string, output []any, usage any) map[string]any {
	if output == nil {
		output = []any{}
	}
	return map[string]any{"id": fmt.Sprintf("resp_sim%d", o.id), "object": "response", "created_at": o.created,
		"status": status, "model": o.s.p.Model, "output": output, "usage": usage}
}
