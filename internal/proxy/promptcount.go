package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// walkJSON counts the prompt text in b, one valid JSON value, by the
// rules of promptCount: a string counts its characters (a data: URL one
// media item instead), a number is a token id, an object whose "type"
// is a media type is one media item, and an object's members count
// except those under a nonText key (a key given twice counts once, the
// last, as a decode into a map keeps it).
func (c *promptCount) walkJSON(b []byte) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // a token id beyond float64's range is still one
	tok, err := dec.Token()
	if err != nil {
		return
	}
	switch t := tok.(type) {
	case string:
		c.countString(t)
	case json.Number:
		c.ids++
	case json.Delim:
		if t == '[' {
			for dec.More() {
				var e json.RawMessage
				if dec.Decode(&e) != nil {
					return
				}
				c.walkJSON(e)
			}
			return
		}
		if t == '{' {
			c.walkObject(dec)
		}
	}
}

// walkObject counts the members of the object whose '{' dec just read.
func (c *promptCount) walkObject(dec *json.Decoder) {
	var keys []string
	var vals []json.RawMessage
	for dec.More() {
		k, err := dec.Token()
		key, _ := k.(string)
		var v json.RawMessage
		if err != nil || dec.Decode(&v) != nil {
			return
		}
		keys, vals = append(keys, key), append(vals, v)
	}
	last := func(key string) int { // the member a decode into a map keeps
		for j := len(keys) - 1; j >= 0; j-- {
			if keys[j] == key {
				return j
			}
		}
		return -1
	}
	if j := last("type"); j >= 0 {
		var t string
		if json.Unmarshal(vals[j], &t) == nil && mediaTypes[t] {
			c.media++
			return
		}
	}
	for j, k := range keys {
		if !nonText[k] && last(k) == j {
			c.walkJSON(vals[j])
		}
	}
}

// countString counts one string of the prompt.
func (c *promptCount) countString(s string) {
	if strings.HasPrefix(s, "data:") {
		c.media++
		return
	}
	c.runes += utf8.RuneCountInString(s)
}
