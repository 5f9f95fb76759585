// Package sse parses server-sent events (text/event-stream) as the WHATWG
// HTML standard defines them (section 9.2, "Server-sent events"): lines
// end at CRLF, LF or CR; a line starting with ':' is a comment; "data"
// lines of one event are joined with "\n"; "event" and "id" set the
// event's type and the last event ID ("retry", which only a reconnecting
// browser reads, is ignored like any unknown field); an event
// is dispatched at a blank line, and one without data is not dispatched.
//
// It is the one parser of the stream for both ends of Sluice: the proxy's
// relay, which forwards a worker's bytes unchanged and feeds a copy of
// them here, and the bench client. Parser is push-based for that: the
// caller reads and keeps its own buffer, and Feed takes whatever a read
// returned, however lines and events fall across reads.
//
// One departure from the standard, on purpose: the standard discards an
// event the stream ends in the middle of (data lines not yet followed by
// a blank line); End dispatches it. A worker that closes its stream right
// after its last data line has still said what that line holds (its
// usage, its final chunk), and both ends of Sluice want to hear it.
package sse

import "bytes"

// DefaultMax is the most bytes Parser keeps of one line or of one
// event's data when its Max is 0.
const DefaultMax = 1 << 20

// bom is the UTF-8 byte order mark, skipped at the start of a stream.
const bom = "\xEF\xBB\xBF"

// Event is one dispatched event. Its slices point into the Parser's
// buffers and are valid only until the callback returns.
type Event struct {
	// Type is the value of the event's last "event" field; empty when it
	// had none (the standard's type "message").
	Type []byte
	// Data is the event's data lines joined with "\n".
	Data []byte
	// ID is the last event ID as of this event: the value of the latest
	// "id" field so far in the stream, this event's or an earlier one's.
	ID []byte
	// Next is, for an event Feed dispatches, the offset in Feed's
	// argument just past the blank line that ended the event: the bytes
	// before it hold every byte of the event (with what came before it in
	// earlier Feeds), so a relay that must never forward part of an event
	// can forward up to Next. It is 0 for an event End dispatches.
	Next int
}

// Parser splits a stream into events. The zero value is ready to use;
// a Parser must not be copied after first use.
type Parser struct {
	// Max bounds the bytes kept of one line and of one event's data
	// (DefaultMax when 0). A longer line is ignored; an event whose data
	// grows past Max is not dispatched. Both are counted in Dropped.
	Max int
	// Dropped counts the lines and events ignored for their size.
	Dropped int

	next    int    // Event.Next of an event dispatched now
	line    []byte // a line not yet ended, carried from one Feed to the next
	over    bool   // the line being carried is over Max: drop it at its end
	cr      bool   // the last byte fed was a CR: a following LF ends nothing
	started bool   // past the stream's start, where a BOM is skipped
	bomN    int    // bytes of a BOM seen at the start so far
	data    []byte // data lines of the pending event, each followed by "\n"
	hasData bool
	tooBig  bool // the pending event's data went over Max
	typ     []byte
	id      []byte
}

func (p *Parser) max() int {
	if p.Max > 0 {
		return p.Max
	}
	return DefaultMax
}

// Feed parses b, the next bytes of the stream, and calls fn with each
// event dispatched in it. It reports whether b ended at least one event
// (held a blank line), dispatched or not.
func (p *Parser) Feed(b []byte, fn func(Event)) (ended bool) {
	total := len(b)
	defer func() { p.next = 0 }()
	for !p.started && len(b) > 0 { // a leading BOM is not part of the stream
		if b[0] == bom[p.bomN] {
			p.bomN++
			b = b[1:]
			p.started = p.bomN == len(bom)
			continue
		}
		p.started = true
		p.carry([]byte(bom[:p.bomN])) // a BOM's first bytes, but no BOM
	}
	if p.cr && len(b) > 0 {
		p.cr = false
		if b[0] == '\n' {
			b = b[1:] // the LF of a CRLF split across reads
		}
	}
	for len(b) > 0 {
		i := lineEnd(b)
		if i < 0 { // the line goes on in the next Feed
			p.carry(b)
			return ended
		}
		l := b[:i]
		switch {
		case b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n':
			b = b[i+2:]
		case b[i] == '\r' && i+1 == len(b):
			p.cr = true
			b = b[i+1:]
		default:
			b = b[i+1:]
		}
		if len(p.line) > 0 || p.over {
			p.carry(l)
			l = p.line
			if p.over {
				p.over = false
				p.line = p.line[:0]
				p.Dropped++
				continue
			}
			p.line = p.line[:0]
		}
		if len(l) == 0 {
			ended = true
		}
		p.next = total - len(b)
		p.process(l, fn)
	}
	return ended
}

// carry keeps b as part of the line not yet ended, up to Max bytes.
func (p *Parser) carry(b []byte) {
	if p.over {
		return
	}
	if len(p.line)+len(b) > p.max() {
		p.over = true
		p.line = p.line[:0]
		return
	}
	p.line = append(p.line, b...)
}

// End ends the stream: a line not ended by a line break is taken as
// ended, and an event with data not yet dispatched is dispatched (see
// the package doc). The Parser may then be reused for a new stream.
func (p *Parser) End(fn func(Event)) {
	if !p.started && p.bomN > 0 {
		p.carry([]byte(bom[:p.bomN]))
	}
	if p.over {
		p.Dropped++
	} else if len(p.line) > 0 {
		p.process(p.line, fn)
	}
	p.process(nil, fn)
	p.line, p.over, p.cr, p.started, p.bomN = p.line[:0], false, false, false, 0
	p.id = p.id[:0]
}

// lineEnd returns the index of the first CR or LF in b, or -1.
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// process interprets one line (without its line end).
func (p *Parser) process(l []byte, fn func(Event)) {
	if len(l) == 0 {
		p.dispatch(fn)
		return
	}
	if l[0] == ':' {
		return // a comment
	}
	field, value := l, []byte(nil)
	if i := bytes.IndexByte(l, ':'); i >= 0 {
		field, value = l[:i], l[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if p.tooBig {
			return
		}
		if len(p.data)+len(value)+1 > p.max() {
			p.tooBig = true
			p.data = p.data[:0]
			return
		}
		p.data = append(p.data, value...)
		p.data = append(p.data, '\n')
		p.hasData = true
	case "event":
		p.typ = append(p.typ[:0], value...)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.id = append(p.id[:0], value...)
		}
	}
}

// dispatch hands the pending event to fn, if it has data, and clears it.
func (p *Parser) dispatch(fn func(Event)) {
	switch {
	case p.tooBig:
		p.Dropped++
	case p.hasData:
		fn(Event{Type: p.typ, Data: p.data[:len(p.data)-1], ID: p.id, Next: p.next})
	}
	p.data, p.typ, p.hasData, p.tooBig = p.data[:0], p.typ[:0], false, false
}
