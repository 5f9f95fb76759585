package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/sse"
)

// Why a stream broke, as metrics, records and logs name it.
const (
	breakUpstream   = "upstream_failed" // cut, or at EOF before its terminator
	breakErrorEvent = "error_event"     // the worker sent an error event
	breakIdle       = "stream_idle"     // nothing for IdleTimeout
	breakDrain      = "drain"           // its worker's drain deadline passed
	breakShutdown   = "shutting_down"   // the router's shutdown grace ended
)

// streamBreak is a stream its worker broke after the first byte, where
// the client has been sent whole events only: it may be continued.
type streamBreak struct {
	reason string
	err    error
}

func (b *streamBreak) Error() string { return fmt.Sprintf("stream broke (%s): %v", b.reason, b.err) }
func (b *streamBreak) Unwrap() error { return b.err }

// contStream is the state of one client's stream across the workers that
// write it: what the client has been sent, so the next worker can be
// asked for exactly the rest, and what to rewrite in that worker's events
// so they read as the first one's.
//
// Tokens sent are counted as llama.cpp streams them, one content event a
// token, unless the worker states its count (usage's completion_tokens,
// llama.cpp's tokens_predicted), which is believed over the events.
type contStream struct {
	route string
	kinds []string
	left  int // continuations left

	id       string          // the first worker's response id
	text     strings.Builder // content sent to the client, all parts
	carried  int             // tokens sent before the current part
	part     int             // content events of the current part sent
	reported int             // tokens the current part's worker stated
	prompt   int             // the original prompt's tokens, when a worker said
	stuck    string          // why it can no longer be continued, if so
	cont     bool            // the current part continues a broken one
	sentAny  bool            // the client has been sent an event
	// overshoot is the tokens the current part was asked for beyond the
	// answer's limit, whose text the client must not get: a stream that
	// broke with its limit used up is asked for one more token, only to
	// hear its end and usage from a worker (endEarly when none answers).
	overshoot int
	// canMove is whether a drain deadline may move the stream now: it
	// is not stuck and has continuations left. The drain's goroutine
	// reads it (movable), hence atomic.
	canMove atomic.Bool
	lastTok time.Time     // when the last content reached the client
	brokeAt time.Time     // lastTok when the stream broke
	gap     time.Duration // break to the first token of the continuation
}

// movable reports whether the stream may be moved elsewhere now (by a
// drain deadline): cutting one that cannot go on would only end it.
func (cs *contStream) movable() bool { return cs.canMove.Load() }

// stick notes why the stream can no longer be continued.
func (cs *contStream) stick(why string) {
	cs.stuck = why
	cs.canMove.Store(false)
}

// emitted is the tokens the client has been sent.
func (cs *contStream) emitted() int {
	if cs.reported > 0 {
		return cs.carried + cs.reported
	}
	return cs.carried + cs.part
}

// contChunk is what the relay reads of an event to follow the text.
type contChunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Delta struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
	Content *string `json:"content"` // llama.cpp native
}

// follow notes what one event the client is being sent holds.
func (cs *contStream) follow(data []byte, info eventInfo) {
	if !info.valid || info.err != "" {
		return
	}
	if info.scanned && info.textOK && info.idOK {
		// The quick scan read all of it: no decode (the common event).
		if cs.id == "" && len(info.id) > 0 {
			cs.id = string(info.id)
		}
		switch {
		case info.tool:
			cs.stick("a tool call began")
		case info.reasoning:
			cs.stick("reasoning text began")
		}
		cs.text.Write(info.text)
		cs.counts(info)
		return
	}
	var c contChunk
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if cs.id == "" && c.ID != "" {
		cs.id = c.ID
	}
	if c.Content != nil {
		cs.text.WriteString(*c.Content)
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" || len(d.FunctionCall) > 0 && string(d.FunctionCall) != "null" {
			cs.stick("a tool call began")
		}
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			cs.stick("reasoning text began")
		}
		if d.Content != nil {
			cs.text.WriteString(*d.Content)
		}
		if ch.Text != nil {
			cs.text.WriteString(*ch.Text)
		}
	}
	cs.counts(info)
}

// counts notes the token counts an event states.
func (cs *contStream) counts(info eventInfo) {
	if info.reported > 0 {
		cs.reported = info.reported // the worker's own count, before any rewrite
	}
	if info.prompt > 0 && !cs.cont {
		cs.prompt = info.prompt
	}
}

// relay copies one part of the stream to the client, whole events only.
// The first part's bytes go as they came; a continuation's events are
// rewritten (rewrite). A part that breaks returns a *streamBreak, having
// sent nothing of the event it broke in (nor an error event); one that
// ends returns as relayStream does.
func (cs *contStream) relay(w http.ResponseWriter, body io.Reader, start time.Time) (measured, error) {
	rc := http.NewResponseController(w)
	bp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bp)
	buf := *bp
	var m streamMeter
	var out measured
	var carry, wbuf []byte // bytes of an event not yet whole; what to write
	cs.part, cs.reported = 0, 0
	broken := ""
	commit := 0
	// onEvent follows one whole event; commit is where it ended.
	onEvent := func(e sse.Event) {
		if broken != "" {
			return
		}
		data := bytes.TrimSpace(e.Data)
		if m.complete() { // after the end: usage, [DONE]; nothing can break
			if cs.cont {
				wbuf = cs.rewrite(wbuf, e, data, readEvent(data))
			}
			return
		}
		m.event(e)
		if m.failed {
			broken = breakErrorEvent
			return
		}
		info := readEvent(data)
		if cs.overshoot > 0 && info.content {
			commit = e.Next // past the limit: not the client's
			return
		}
		if cs.cont {
			wbuf = cs.rewrite(wbuf, e, data, info)
		}
		cs.follow(data, info)
		if info.content {
			cs.part++
			cs.lastTok = time.Now()
			if cs.cont && cs.gap == 0 {
				cs.gap = cs.lastTok.Sub(cs.brokeAt)
			}
		}
		commit = e.Next
	}
	var readErr, writeErr error
	for broken == "" && writeErr == nil {
		n, err := body.Read(buf)
		if n > 0 {
			b := buf[:n]
			wasComplete := m.complete()
			commit, wbuf, m.first = 0, wbuf[:0], false
			m.parser.Feed(b, onEvent)
			if m.first {
				out.ttft = time.Since(start)
			}
			if !cs.cont {
				switch {
				case wasComplete:
					wbuf = append(wbuf, b...) // after the end, as it comes
				case m.complete():
					wbuf = append(append(wbuf, carry...), b...)
					carry = carry[:0]
				case commit > 0:
					wbuf = append(append(wbuf, carry...), b[:commit]...)
					carry = append(carry[:0], b[commit:]...)
				default:
					carry = append(carry, b...)
				}
			}
			if len(wbuf) > 0 {
				cs.sentAny = true
				if _, werr := w.Write(wbuf); werr != nil {
					writeErr = werr
				}
				rc.Flush()
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if broken == "" && writeErr == nil && readErr == nil && !m.complete() {
		// A clean EOF: what is pending may be a last event without its
		// blank line, as relayStream would relay it.
		wbuf = wbuf[:0]
		if cs.cont {
			m.parser.End(onEvent)
		} else if m.end(); m.complete() {
			wbuf = append(wbuf, carry...)
		}
		if len(wbuf) > 0 {
			w.Write(wbuf)
			rc.Flush()
		}
	}
	out.tokens = m.tokens()
	out.promptTokens = m.prompt
	out.complete = m.complete()
	switch {
	case out.complete:
		return out, nil
	case writeErr != nil:
		return out, fmt.Errorf("%w: %v", errClientGone, writeErr)
	case broken != "":
		return out, &streamBreak{reason: broken, err: fmt.Errorf("worker sent an error event: %s", m.failure)}
	case errors.Is(readErr, ErrStreamIdle):
		return out, &streamBreak{reason: breakIdle, err: readErr}
	case readErr != nil:
		return out, &streamBreak{reason: breakUpstream, err: fmt.Errorf("the worker's stream broke: %w", readErr)}
	}
	return out, &streamBreak{reason: breakUpstream, err: ErrStreamTruncated}
}

// rewrite appends to out the event e of a continuation as the client's
// stream must read it: the first part's id, no role (the client had it),
// token counts that add the parts before, the original prompt's size; an
// event left with nothing to say (the role chunk) is dropped.
func (cs *contStream) rewrite(out []byte, e sse.Event, data []byte, info eventInfo) []byte {
	if !info.valid {
		return appendEvent(out, e.Type, data)
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return appendEvent(out, e.Type, data)
	}
	if _, ok := m["id"]; ok && cs.id != "" {
		m["id"], _ = json.Marshal(cs.id)
	}
	empty := len(m["usage"]) == 0 || string(m["usage"]) == "null"
	if raw, ok := m["choices"]; ok {
		var choices []map[string]json.RawMessage
		if json.Unmarshal(raw, &choices) == nil {
			for _, ch := range choices {
				if fr := ch["finish_reason"]; len(fr) > 0 && string(fr) != "null" {
					empty = false
				}
				var d map[string]json.RawMessage
				if json.Unmarshal(ch["delta"], &d) != nil {
					empty = empty && !info.content
					continue
				}
				if cs.sentAny {
					delete(d, "role")
				}
				for k, v := range d {
					if k == "content" && (string(v) == `""` || string(v) == "null") {
						continue
					}
					empty = false
				}
				ch["delta"], _ = json.Marshal(d)
			}
			m["choices"], _ = json.Marshal(choices)
		}
	} else {
		empty = false // not a chat chunk: llama.cpp native, or another shape
	}
	if empty && !info.content {
		return out // a role chunk: the client had its role from the first part
	}
	prompt := func(own int) int {
		if cs.prompt > 0 {
			return cs.prompt
		}
		return max(own-cs.carried, 0)
	}
	if raw := m["usage"]; len(raw) > 0 && string(raw) != "null" {
		var u map[string]json.RawMessage
		if json.Unmarshal(raw, &u) == nil {
			var pt, ct int
			json.Unmarshal(u["prompt_tokens"], &pt)
			json.Unmarshal(u["completion_tokens"], &ct)
			pt, ct = prompt(pt), max(ct-cs.overshoot, 0)+cs.carried
			u["prompt_tokens"], u["completion_tokens"], u["total_tokens"] = num(pt), num(ct), num(pt+ct)
			m["usage"], _ = json.Marshal(u)
		}
	}
	if raw, ok := m["tokens_predicted"]; ok {
		var n int
		json.Unmarshal(raw, &n)
		m["tokens_predicted"] = num(max(n-cs.overshoot, 0) + cs.carried)
	}
	if raw, ok := m["tokens_evaluated"]; ok {
		var n int
		json.Unmarshal(raw, &n)
		m["tokens_evaluated"] = num(prompt(n))
	}
	b, err := json.Marshal(m)
	if err != nil {
		return appendEvent(out, e.Type, data)
	}
	return appendEvent(out, e.Type, b)
}

func num(n int) json.RawMessage { return json.RawMessage(fmt.Sprint(n)) }

// appendEvent appends one SSE event of type typ (none when empty).
func appendEvent(out, typ, data []byte) []byte {
	if len(typ) > 0 {
		out = append(append(append(out, "event: "...), typ...), '\n')
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		out = append(append(append(out, "data: "...), line...), '\n')
	}
	return append(out, '\n')
}

// endEarly ends a stream whose every token the client already has (its
// token limit is used up) but whose end its worker never sent: the final
// event of the route's shape, then [DONE] where the route has one.
func (cs *contStream) endEarly(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	var ev []byte
	switch cs.route {
	case routeNative:
		ev, _ = json.Marshal(map[string]any{"content": "", "stop": true, "stop_type": "limit", "tokens_predicted": cs.emitted()})
	case routeChat:
		ev, _ = json.Marshal(map[string]any{"id": cs.id, "object": "chat.completion.chunk",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "length"}}})
	default:
		ev, _ = json.Marshal(map[string]any{"id": cs.id, "object": "text_completion",
			"choices": []any{map[string]any{"index": 0, "text": "", "finish_reason": "length"}}})
	}
	out := appendEvent(nil, nil, ev)
	if cs.route != routeNative {
		out = append(out, "data: [DONE]\n\n"...)
	}
	w.Write(out)
	rc.Flush()
}
