package proxy

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// walkJSON counts the prompt text in b, one valid JSON value, by the
// rules of promptCount: a string counts its characters (a data: URL one
// media item instead), a number is a token id, an object whose "type"
// is a media type is one media item, and an object's members count
// except those under a nonText key (a key given twice counts once, the
// last, as a decode into a map keeps it). It reads the bytes as they
// are, in document order, without decoding the value into maps: on a
// 20 KB chat body that decode, done a second time after the body's own,
// was most of the request path's parsing.
func (c *promptCount) walkJSON(b []byte) {
	i := skipSpace(b, 0)
	if i >= len(b) {
		return
	}
	switch b[i] {
	case '"':
		end := skipString(b, i)
		c.countString(b[i:end])
	case '[':
		for _, e := range elems(b, i) {
			c.walkJSON(e)
		}
	case '{':
		ms := members(b, i)
		for j := len(ms) - 1; j >= 0; j-- {
			if ms[j].key == "type" {
				if t, ok := jsonStringValue(ms[j].val); ok && mediaTypes[t] {
					c.media++
					return
				}
				break
			}
		}
	next:
		for j, m := range ms {
			if nonText[m.key] {
				continue
			}
			for _, later := range ms[j+1:] {
				if later.key == m.key {
					continue next
				}
			}
			c.walkJSON(m.val)
		}
	case 't', 'f', 'n':
	default: // a number
		c.ids++
	}
}

// countString counts q, a JSON string with its quotes.
func (c *promptCount) countString(q []byte) {
	if len(q) < 2 || q[len(q)-1] != '"' {
		return
	}
	raw := q[1 : len(q)-1]
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		var s string
		if json.Unmarshal(q, &s) != nil {
			return
		}
		raw = []byte(s)
	}
	if bytes.HasPrefix(raw, []byte("data:")) {
		c.media++
		return
	}
	c.runes += utf8.RuneCount(raw)
	if c.text.Len() < maxPromptText {
		if c.text.Len() > 0 {
			c.text.WriteByte('\n')
		}
		c.text.Write(raw)
	}
}

// member is one key and value of a JSON object.
type member struct {
	key string
	val []byte
}

// members returns the members of the valid object starting at b[i].
func members(b []byte, i int) []member {
	var ms []member
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] != '}' {
		kEnd := skipString(b, i)
		key, _ := jsonStringValue(b[i:kEnd])
		v := skipSpace(b, skipSpace(b, kEnd)+1) // past the colon
		vEnd := skipValue(b, v)
		ms = append(ms, member{key, b[v:vEnd]})
		i = skipSpace(b, vEnd)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return ms
}

// elems returns the elements of the valid array starting at b[i].
func elems(b []byte, i int) [][]byte {
	var es [][]byte
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] != ']' {
		end := skipValue(b, i)
		es = append(es, b[i:end])
		i = skipSpace(b, end)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return es
}

// countElems is the number of elements of the valid array b.
func countElems(b []byte) int {
	n := 0
	i := skipSpace(b, skipSpace(b, 0)+1)
	for i < len(b) && b[i] != ']' {
		i = skipSpace(b, skipValue(b, i))
		n++
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return n
}

// jsonStringValue decodes q when it is a JSON string.
func jsonStringValue(q []byte) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	raw := q[1 : len(q)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(q, &s) != nil {
		return "", false
	}
	return s, true
}

func skipSpace(b []byte, i int) int {
	i = min(i, len(b))
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index past the string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return len(b)
		}
		i += q
		// Escaped when an odd number of backslashes runs up to it.
		n := 0
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return i + 1
		}
		i++
	}
	return len(b)
}

// skipValue returns the index past the valid JSON value starting at b[i],
// at least i+1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	// Always past one byte at least, so that a scan over bytes that are
	// not JSON (never passed here) still ends.
	return max(i, start+1)
}
