package proxy

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// eventInfo is what the relay takes from one streamed event's data.
type eventInfo struct {
	valid    bool   // the data decodes as a chunk
	err      string // the worker's non-null "error" value, as it sent it
	content  bool   // it carries generated text
	final    bool   // it ends the answer (finish_reason, or native stop)
	reported int    // output tokens the worker states, or 0 (may be negative: not believed)
	prompt   int    // prompt tokens the worker states, or 0
	usage    bool   // it carries a usage object, whose prompt count has the last word

	// What a continuable stream follows (contStream.follow), when the
	// quick scan read the event (scanned): the text it carries (text,
	// the one non-empty content, delta.content or choice text, escape-free
	// — textOK false when there is more than one or it has escapes), its
	// top-level id (escape-free, else idOK false), and whether its delta
	// starts a tool call or carries reasoning text.
	scanned, textOK, idOK bool
	text, id              []byte
	texts                 int // non-empty text values seen
	tool, reasoning       bool
}

func seenText(info *eventInfo) bool { return info.texts > 0 }

// metered is the part of info that metering reads (the rest is for
// contStream.follow): what the quick scan and the decode must agree on.
func (info eventInfo) metered() meteredInfo {
	return meteredInfo{info.valid, info.err, info.content, info.final, info.reported, info.prompt, info.usage}
}

// meteredInfo is eventInfo's metering fields, comparable.
type meteredInfo struct {
	valid            bool
	err              string
	content, final   bool
	reported, prompt int
	usage            bool
}

// readEvent reads one event's data: by the quick scan where it can, by
// decoding it whole (decodeEvent) where the scan cannot answer.
func readEvent(data []byte) eventInfo {
	if info, ok := scanEvent(data); ok {
		return info
	}
	return decodeEvent(data)
}

// decodeEvent reads one event's data by decoding it into a chunk: the
// reference scanEvent must agree with.
func decodeEvent(data []byte) eventInfo {
	var c chunk
	if json.Unmarshal(data, &c) != nil {
		return eventInfo{}
	}
	if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
		return eventInfo{valid: true, err: string(c.Error)}
	}
	return eventInfo{
		valid:    true,
		content:  c.hasContent(),
		final:    c.final(),
		reported: c.reportedTokens(),
		prompt:   c.promptCount(),
		usage:    c.Usage != nil,
	}
}

// scanEvent reads the data of an ordinary content event without decoding
// it: one pass over the bytes that checks the JSON syntax and looks at
// the few keys the relay needs (choices[].delta.content and
// .reasoning_content, choices[].text and .finish_reason, content, stop,
// tokens_predicted). Where its answer could differ from decodeEvent's, it
// gives none (ok false) and the caller decodes: a usage, timings or error
// that is not null, a key of interest given twice (encoding/json would
// merge them), a key with escapes or non-ASCII bytes (encoding/json
// folds those), a value of a type other than the chunk's, deep nesting,
// invalid JSON. Those are rare: a stream's last event or two, and errors.
func scanEvent(data []byte) (info eventInfo, ok bool) {
	s := scanner{b: data}
	s.ws()
	if !s.is('{') {
		return info, false
	}
	info.textOK, info.idOK = true, true
	var seen uint8
	var content, stop bool
	tokens := 0
	done := s.members(func(key []byte) bool {
		f := topKey(key)
		if f >= 0 {
			if seen&(1<<f) != 0 {
				return false
			}
			seen |= 1 << f
		}
		switch f {
		case keyChoices:
			return s.choices(&info)
		case keyContent:
			var set bool
			set, content = s.optText(&info)
			return set
		case keyID:
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				info.idOK = false // not a string: decoded, should it matter
				return s.skip(0)
			}
			start := s.i
			plain, ok := s.str()
			if !ok {
				return false
			}
			info.id = s.b[start+1 : s.i-1]
			info.idOK = plain && utf8.Valid(info.id)
			return true
		case keyStop:
			return s.optBool(&stop)
		case keyTokensPredicted:
			return s.optInt(&tokens)
		case keyUsage, keyTimings, keyError:
			return s.null()
		}
		return s.skip(0)
	})
	if !done {
		return info, false
	}
	if s.ws(); s.i != len(s.b) {
		return info, false
	}
	info.valid, info.scanned = true, true
	info.content = info.content || content
	info.final = info.final || stop
	info.reported = tokens
	return info, true
}

// Keys of chunk that scanEvent tells apart, as bit numbers.
const (
	keyChoices = iota
	keyContent
	keyStop
	keyTokensPredicted
	keyUsage
	keyTimings
	keyError
	keyID
)

// topKey returns the chunk field a top-level key names, or -1. Matching
// is ASCII case-insensitive, as encoding/json's is for ASCII keys.
func topKey(k []byte) int {
	switch {
	case bytes.EqualFold(k, []byte("choices")):
		return keyChoices
	case bytes.EqualFold(k, []byte("content")):
		return keyContent
	case bytes.EqualFold(k, []byte("stop")):
		return keyStop
	case bytes.EqualFold(k, []byte("tokens_predicted")):
		return keyTokensPredicted
	case bytes.EqualFold(k, []byte("usage")):
		return keyUsage
	case bytes.EqualFold(k, []byte("timings")):
		return keyTimings
	case bytes.EqualFold(k, []byte("error")):
		return keyError
	case bytes.EqualFold(k, []byte("id")):
		return keyID
	}
	return -1
}

// scanner walks JSON text. Its methods return false where the text is
// invalid or of a shape scanEvent leaves to decodeEvent.
type scanner struct {
	b []byte
	i int
}

// maxDepth bounds the nesting skip follows; deeper text is decoded.
const maxDepth = 64

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// is consumes c if it is the next byte.
func (s *scanner) is(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// members walks the members of an object whose '{' was consumed,
// calling value with each key (ASCII, no escapes) when its value is next;
// value consumes the value.
func (s *scanner) members(value func(key []byte) bool) bool {
	s.ws()
	if s.is('}') {
		return true
	}
	for {
		start := s.i + 1
		plain, ok := s.str()
		if !ok || !plain {
			return false
		}
		key := s.b[start : s.i-1]
		for _, c := range key {
			if c >= 0x80 {
				return false
			}
		}
		s.ws()
		if !s.is(':') {
			return false
		}
		s.ws()
		if !value(key) {
			return false
		}
		s.ws()
		if s.is(',') {
			s.ws()
			continue
		}
		return s.is('}')
	}
}

// str consumes a string and reports whether it has no escapes.
func (s *scanner) str() (plain, ok bool) {
	if !s.is('"') {
		return false, false
	}
	plain = true
	b := s.b
	for i := s.i; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(b) {
				return false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !hex4(b[i+2:i+6]) {
					return false, false
				}
				i += 6
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		default:
			i++
		}
	}
	return false, false
}

func hex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// lit consumes the literal word.
func (s *scanner) lit(word string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}

// null consumes a null.
func (s *scanner) null() bool { return s.lit("null") }

// number consumes a JSON number and reports whether it is an integer
// (no fraction or exponent).
func (s *scanner) number() (integer, ok bool) {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return false, false
	}
	integer = true
	if i < len(b) && b[i] == '.' {
		integer = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return false, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integer = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return false, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	s.i = i
	return integer, true
}

// skip consumes any value, checking its syntax.
func (s *scanner) skip(depth int) bool {
	if s.i >= len(s.b) || depth > maxDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		s.i++
		return s.members(func([]byte) bool { return s.skip(depth + 1) })
	case c == '[':
		s.i++
		return s.elements(func() bool { return s.skip(depth + 1) })
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '-' || '0' <= c && c <= '9':
		_, ok := s.number()
		return ok
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.null()
	}
	return false
}

// elements walks the elements of an array whose '[' was consumed,
// calling value when each is next.
func (s *scanner) elements(value func() bool) bool {
	s.ws()
	if s.is(']') {
		return true
	}
	for {
		if !value() {
			return false
		}
		s.ws()
		if s.is(',') {
			s.ws()
			continue
		}
		return s.is(']')
	}
}

// optString consumes a string or null (a *string field): set is false
// for anything else, and nonEmpty says whether it was a non-empty string.
func (s *scanner) optString() (set, nonEmpty bool) {
	if s.null() {
		return true, false
	}
	start := s.i
	if _, ok := s.str(); !ok {
		return false, false
	}
	return true, s.i-start > 2
}

// optText is optString for a value that carries generated text: a
// non-empty one is noted in info.text, the first; a second, or one with
// escapes, makes info.textOK false (the text must then be decoded).
func (s *scanner) optText(info *eventInfo) (set, nonEmpty bool) {
	if s.null() {
		return true, false
	}
	start := s.i
	plain, ok := s.str()
	if !ok {
		return false, false
	}
	if s.i-start <= 2 {
		return true, false
	}
	info.text = s.b[start+1 : s.i-1]
	if !plain || !utf8.Valid(info.text) || seenText(info) {
		info.textOK = false // decoded instead: escapes, bad UTF-8, or two texts
	}
	info.texts++
	return true, true
}

// optBool consumes a bool into *v, or a null, which leaves *v as it is.
func (s *scanner) optBool(v *bool) bool {
	switch {
	case s.lit("true"):
		*v = true
	case s.lit("false"):
		*v = false
	default:
		return s.null()
	}
	return true
}

// optInt consumes an integer of at most 18 digits into *v, or a null,
// which leaves *v as it is.
func (s *scanner) optInt(v *int) bool {
	if s.null() {
		return true
	}
	start := s.i
	integer, ok := s.number()
	if !ok || !integer || s.i-start > 18 {
		return false
	}
	n, neg := 0, false
	for _, c := range s.b[start:s.i] {
		if c == '-' {
			neg = true
			continue
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	*v = n
	return true
}

// choices consumes the value of "choices", null or an array of choice
// objects (or nulls), and notes in info what they carry.
func (s *scanner) choices(info *eventInfo) bool {
	if s.null() {
		return true // encoding/json makes the slice nil: nothing carried
	}
	if !s.is('[') {
		return false
	}
	return s.elements(func() bool {
		if s.null() {
			return true
		}
		if !s.is('{') {
			return false
		}
		var seen uint8
		return s.members(func(key []byte) bool {
			var bit uint8
			switch {
			case bytes.EqualFold(key, []byte("delta")):
				bit = 1
			case bytes.EqualFold(key, []byte("text")):
				bit = 2
			case bytes.EqualFold(key, []byte("finish_reason")):
				bit = 4
			default:
				return s.skip(1)
			}
			if seen&bit != 0 {
				return false
			}
			seen |= bit
			switch bit {
			case 1:
				return s.delta(info)
			case 2:
				set, nonEmpty := s.optText(info)
				info.content = info.content || nonEmpty
				return set
			}
			set, nonEmpty := s.optString()
			info.final = info.final || nonEmpty
			return set
		})
	})
}

// delta consumes a choice's "delta", null or an object, and notes
// whether it carries content or reasoning_content.
func (s *scanner) delta(info *eventInfo) bool {
	if s.null() {
		return true
	}
	if !s.is('{') {
		return false
	}
	var seen uint8
	return s.members(func(key []byte) bool {
		var bit uint8
		switch {
		case bytes.EqualFold(key, []byte("content")):
			bit = 1
		case bytes.EqualFold(key, []byte("reasoning_content")):
			bit = 2
		case bytes.EqualFold(key, []byte("tool_calls")):
			bit = 4
		case bytes.EqualFold(key, []byte("function_call")):
			bit = 8
		default:
			return s.skip(2)
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		switch bit {
		case 1:
			set, nonEmpty := s.optText(info)
			info.content = info.content || nonEmpty
			return set
		case 2:
			set, nonEmpty := s.optString()
			info.content = info.content || nonEmpty
			info.reasoning = info.reasoning || nonEmpty
			return set
		}
		if s.null() {
			return true
		}
		info.tool = true
		return s.skip(2)
	})
}
