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

// streamBreak is a stream its worker broke after the first byte: one
// relayed whole events at a time may be continued.
type streamBreak struct {
	reason string
	err    error
	told   bool // the client has the worker's own error event
}

func (b *streamBreak) Error() string { return fmt.Sprintf("stream broke (%s): %v", b.reason, b.err) }
func (b *streamBreak) Unwrap() error { return b.err }

// contStream is the state of one client's stream across the workers that
// write it: what the client has been sent, so the next worker can be
// asked for exactly the rest, and what to rewrite in that worker's events
// so they read as the first one's. A stream that cannot be continued
// (no route: see continuation) has one part, relayed as it comes.
//
// Tokens sent are counted as llama.cpp streams them, one content event a
// token, unless the worker states its count (usage's completion_tokens,
// llama.cpp's tokens_predicted), which is believed over the events.
type contStream struct {
	proto *protocol // how its events read
	route string    // how it is continued; "" when it cannot be
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

// resumable reports whether the stream may be continued elsewhere,
// and so is relayed whole events at a time.
func (cs *contStream) resumable() bool { return cs.route != "" }

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

// follow notes what one event the client is being sent holds.
func (cs *contStream) follow(info eventInfo) {
	if !info.valid || info.err != "" {
		return
	}
	if cs.id == "" {
		cs.id = info.id
	}
	switch {
	case info.tool:
		cs.stick("a tool call began")
	case info.reasoning:
		cs.stick("reasoning text began")
	}
	cs.text.WriteString(info.text)
	cs.counts(info)
}

// counts notes the token counts an event states.
func (cs *contStream) counts(info eventInfo) {
	// The worker's own count, before any rewrite, less a token asked
	// for beyond the limit, which the client does not get.
	if n := info.reported - cs.overshoot; n > 0 {
		cs.reported = n
	}
	if info.prompt > 0 && !cs.cont {
		cs.prompt = info.prompt
	}
}

// relay copies one worker's answer (one part of the stream) to the
// client, flushing what each read brought, and meters it. A stream that
// cannot be continued goes byte for byte, the worker's error events too.
// A continuable one goes whole events at a time, so that a break leaves
// the client at an event boundary; a continuation's events are rewritten,
// and a worker's error event is held back, since another worker may yet
// write the rest.
//
// It returns nil when the stream delivered its end ([DONE], or a final
// chunk), whatever happens after (many clients close the body at [DONE],
// which cancels the worker's request under the last read);
// errClientGone when a write to the client failed before the end; else a
// *streamBreak saying why.
func (cs *contStream) relay(w http.ResponseWriter, body io.Reader, start time.Time) (measured, error) {
	rc := http.NewResponseController(w)
	bp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bp)
	buf := *bp
	pt := part{cs: cs, m: streamMeter{read: cs.proto.read}}
	cs.part, cs.reported = 0, 0
	var readErr, writeErr error
	for pt.broken == "" && writeErr == nil {
		n, err := body.Read(buf)
		if n > 0 {
			pt.feed(buf[:n])
			if pt.m.first {
				pt.out.ttft = time.Since(start)
			}
			if len(pt.wbuf) > 0 {
				cs.sentAny = true
				if _, werr := w.Write(pt.wbuf); werr != nil {
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
	if pt.end(readErr == nil && writeErr == nil) {
		w.Write(pt.wbuf)
	}
	if pt.m.first {
		pt.out.ttft = time.Since(start)
	}
	rc.Flush()
	return pt.result(readErr, writeErr)
}

// part is the state of one relay: the meter, and for a whole-event relay
// the bytes held back and the bytes to write after a read.
type part struct {
	cs     *contStream
	m      streamMeter
	out    measured
	wbuf   []byte // what to write to the client after this read
	carry  []byte // bytes of an event not yet whole
	commit int    // where the last event the client gets ended, in this read
	broken string // why the part broke, from its events
}

// feed reads the bytes b of a read and sets wbuf to what the client
// gets of them.
func (pt *part) feed(b []byte) {
	cs := pt.cs
	wasComplete := pt.m.complete()
	pt.commit, pt.wbuf, pt.m.first = 0, pt.wbuf[:0], false
	pt.m.parser.Feed(b, pt.event)
	switch {
	case cs.cont:
		// Rewritten event by event.
	case !cs.resumable() || wasComplete:
		pt.wbuf = append(pt.wbuf, b...) // as it comes
	case pt.m.complete():
		pt.wbuf = append(append(pt.wbuf, pt.carry...), b...)
		pt.carry = pt.carry[:0]
	case pt.commit > 0:
		pt.wbuf = append(append(pt.wbuf, pt.carry...), b[:pt.commit]...)
		pt.carry = append(pt.carry[:0], b[pt.commit:]...)
	default:
		pt.carry = append(pt.carry, b...)
	}
}

// event follows one whole event; commit is where it ended.
func (pt *part) event(e sse.Event) {
	cs := pt.cs
	if !cs.resumable() {
		pt.m.take(e)
		return
	}
	if pt.broken != "" {
		return
	}
	data := bytes.TrimSpace(e.Data)
	ended := pt.m.complete() // what follows the end (usage, [DONE]) cannot break it
	info := pt.m.take(e)
	if pt.m.failed {
		pt.broken = breakErrorEvent
		return
	}
	if ended {
		cs.counts(info)
		if cs.cont {
			pt.wbuf = cs.rewrite(pt.wbuf, e, data, info)
		}
		return
	}
	if cs.overshoot > 0 && info.content {
		pt.commit = e.Next // past the limit: not the client's
		return
	}
	if cs.cont {
		pt.wbuf = cs.rewrite(pt.wbuf, e, data, info)
	}
	cs.follow(info)
	if info.content {
		cs.part++
		cs.lastTok = time.Now()
		if cs.cont && cs.gap == 0 {
			cs.gap = cs.lastTok.Sub(cs.brokeAt)
		}
	}
	pt.commit = e.Next
}

// end reads what is pending at the end of the answer: a last event
// without its blank line. A stream relayed as it came has the bytes
// already and meters them whatever ended it; a whole-event relay takes
// them only at a clean end (clean), and returns with wbuf what the
// client still gets.
func (pt *part) end(clean bool) (write bool) {
	cs := pt.cs
	pt.m.first = false
	switch {
	case !cs.resumable():
		pt.m.end()
		return false
	case !clean || pt.broken != "" || pt.m.complete():
		return false
	}
	pt.wbuf = pt.wbuf[:0]
	if cs.cont {
		pt.m.parser.End(pt.event)
	} else if pt.m.end(); pt.m.complete() {
		pt.wbuf = append(pt.wbuf, pt.carry...)
	}
	return len(pt.wbuf) > 0
}

// result classifies how the part ended (see relay).
func (pt *part) result(readErr, writeErr error) (measured, error) {
	m, out := &pt.m, pt.out
	out.tokens, out.promptTokens, out.complete = m.tokens(), m.prompt, m.complete()
	out.cachedTokens, out.cachedKnown = m.cached, m.cachedKnown
	switch {
	case m.failed:
		// A stream relayed as it came gave the client the worker's error
		// event; a whole-event relay held it back.
		return out, &streamBreak{reason: breakErrorEvent, told: !pt.cs.resumable(), err: fmt.Errorf("worker sent an error event: %s", m.failure)}
	case out.complete:
		return out, nil
	case writeErr != nil:
		return out, fmt.Errorf("%w: %v", errClientGone, writeErr)
	case errors.Is(readErr, ErrStreamIdle):
		return out, &streamBreak{reason: breakIdle, err: readErr}
	case errors.Is(readErr, errShutdown):
		return out, &streamBreak{reason: breakShutdown, err: readErr}
	case readErr != nil:
		return out, &streamBreak{reason: breakUpstream, err: fmt.Errorf("the worker's stream broke: %w", readErr)}
	}
	return out, &streamBreak{reason: breakUpstream, err: ErrStreamTruncated}
}

// endStream ends a stream that broke for good with Sluice's error event,
// in the protocol's shape: what failed, in the client's terms (ft; brk's
// error, logged where it broke, says how). A worker's error event the
// client already has says it.
func endStream(w http.ResponseWriter, proto *protocol, ft failureText, brk *streamBreak) {
	if brk.told {
		return
	}
	w.Write(proto.streamError(brk.code(), ft.streamEnd(brk.reason, brk.err)))
	http.NewResponseController(w).Flush()
}

// code is the break as the client's error event and the Result's reason
// name it: an idle worker and the router's shutdown by their own names,
// every other fault of the worker as upstream_failed.
func (b *streamBreak) code() string {
	if b.reason == breakIdle || b.reason == breakShutdown {
		return b.reason
	}
	return breakUpstream
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
	for k := range m {
		if strings.EqualFold(k, "id") && cs.id != "" { // keys match as a decode matches them
			m[k], _ = json.Marshal(cs.id)
		}
	}
	empty := !isSet(m["usage"])
	if raw, ok := m["choices"]; ok {
		var choices []map[string]json.RawMessage
		if json.Unmarshal(raw, &choices) == nil {
			for _, ch := range choices {
				if isSet(ch["finish_reason"]) {
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
	if raw := m["usage"]; isSet(raw) {
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
