package proxy

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// refCount is promptCount's rule as it was first written, over a decode
// into maps: the reference walkJSON must agree with. Its text comes in a
// map's order, so the strings are compared as a sorted list.
type refCount struct {
	runes, ids, media, messages int
}

func (c *refCount) add(raw []byte) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return
	}
	if msgs, ok := v.([]any); ok && len(msgs) > 0 {
		if _, isObj := msgs[0].(map[string]any); isObj {
			c.messages += len(msgs)
		}
	}
	c.walk(v)
}

func (c *refCount) walk(v any) {
	switch x := v.(type) {
	case string:
		if strings.HasPrefix(x, "data:") {
			c.media++
			return
		}
		c.runes += utf8.RuneCountInString(x)
	case float64:
		c.ids++
	case []any:
		for _, e := range x {
			c.walk(e)
		}
	case map[string]any:
		if t, ok := x["type"].(string); ok && mediaTypes[t] {
			c.media++
			return
		}
		for k, e := range x {
			if !nonText[k] {
				c.walk(e)
			}
		}
	}
}

// agree checks walkJSON (through add) against the reference on raw.
func agree(t *testing.T, raw string) {
	t.Helper()
	var ref refCount
	ref.add([]byte(raw))
	var got promptCount
	got.add(json.RawMessage(raw))
	type counts struct{ Runes, IDs, Media, Messages int }
	if diff := cmp.Diff(counts{ref.runes, ref.ids, ref.media, ref.messages}, counts{got.runes, got.ids, got.media, got.messages}); diff != "" {
		t.Errorf("counts of %q differ (-reference +walkJSON):\n%s", raw, diff)
	}
}

func TestWalkJSON_AgreesWithTheDecodeIntoMaps(t *testing.T) {
	for _, raw := range []string{
		`[{"role":"system","content":"Be terse."},{"role":"user","content":"héllo wörld"}]`,
		`[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]`,
		`[{"role":"user","content":[{"image_url":{"url":"data:image/png;base64,AAAA"},"type":"image_url"}]}]`,
		`[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]`,
		`"a plain prompt with an escaped \"quote\", a tab\tand \u00e9"`,
		`["two","prompts"]`,
		`[1, 2, 3, 50256]`,
		`[[1,2],[3]]`,
		` { "text" : "spaced" , "text" : "repeated key: the last counts" , "type" : "input_text" } `,
		`{"type":"\u0069mage","url":"escaped media type"}`,
		`"data:text/plain;base64,SGVsbG8="`,
		`[{"role":"user","content":"line one\nline two"}]`,
		`[]`, `{}`, `""`, `true`, `null`, `-1.5e3`,
		`[{"cache_control":{"type":"ephemeral"},"type":"text","text":"cached block"}]`,
		"\"invalid utf-8: \xff\xfe\"",
	} {
		agree(t, raw)
	}
}

func FuzzWalkJSON(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":[{"type":"text","text":"look"}]}]`,
		`{"a":[1,"b",{"type":"audio"}],"id":"x","a":"dup"}`,
		`"\u00e9\n\"x\""`,
		// Inputs that once hung or panicked the walk (not JSON), and a
		// number past float64's range.
		`["r"s"leoeru:","content":[{"type":"text","text":"look"}]`,
		`{"a":]`, `{"a"`, `["`, `{"`, `1E700`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var v any
		// Not JSON, or JSON a decode into maps refuses (a number past
		// float64's range, which walkJSON counts as the token id it is).
		if json.Unmarshal([]byte(raw), &v) != nil {
			var c promptCount
			c.walkJSON([]byte(raw)) // must not panic or loop on what a caller should never pass
			return
		}
		agree(t, raw)
	})
}
