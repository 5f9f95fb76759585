package prefix

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzFromBody feeds arbitrary bodies to the parser of client requests:
// it must not panic, must give the same hashes for the same body, and
// every hash list it returns holds only whole blocks of a text at least
// that long.
func FuzzFromBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello there, this is long enough for a block"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"part one and part two of it"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"prompt":"a raw prompt of a few more words than one block"}`,
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}`,
		`{"messages":null,"prompt":null}`,
		`{"messages":[{"role":1}]}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a := fromBody(body, 16)
		b := fromBody(body, 16)
		if !slices.Equal(a, b) {
			t.Fatalf("two calls on the same body differ: %v vs %v", a, b)
		}
		if len(a) > 0 && len(a)*16 > len(body)*6+64 {
			// Rendering adds 6 bytes around each message, which takes at
			// least 2 bytes of body ({}); unescaping JSON text never
			// lengthens it (invalid UTF-8 becomes U+FFFD, 3 bytes, from
			// at least 1).
			t.Fatalf("%d blocks of 16 bytes from a %d-byte body", len(a), len(body))
		}
		for _, h := range a {
			if h == 0 {
				t.Fatalf("a block hash is 0, which means none")
			}
		}
	})
}

// FuzzPlainString holds plainString to json.Unmarshal: whatever it
// accepts must be a JSON string whose text is exactly what it returns.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"hello"`, `"héllo"`, `"a\nb"`, `"a\"b"`, "\"\xff\"", "\"\x01\"", `"`, `""`, `"abc" `, `"a"b"`, `"\u2028"`, "\"\u2028\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		text, ok := plainString(raw)
		if !ok {
			return
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("plainString took %q, which json.Unmarshal refuses: %v", raw, err)
		}
		if s != string(text) {
			t.Fatalf("plainString(%q) = %q, json.Unmarshal says %q", raw, text, s)
		}
	})
}

func TestPlainString_TakesTextWithoutEscapes(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		ok   bool
		text string
	}{
		{`"hello there"`, true, "hello there"},
		{`"héllo ☃"`, true, "héllo ☃"},
		{`""`, true, ""},
		{`"a\nb"`, false, ""},     // an escape: decoded instead
		{"\"\xffab\"", false, ""}, // invalid UTF-8 becomes U+FFFD when decoded
		{`[1]`, false, ""},
	} {
		text, ok := plainString([]byte(tt.raw))
		if ok != tt.ok || (ok && string(text) != tt.text) {
			t.Errorf("plainString(%q) = %q, %v; want %q, %v", tt.raw, text, ok, tt.text, tt.ok)
		}
	}
}

// fromBody is the hashes of a whole request body, decoded as the proxy
// decodes it (prefixtest.FromBody, which this package's tests cannot
// import).
func fromBody(b []byte, blockBytes int) []uint64 {
	var in struct {
		Messages []Message       `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
	}
	if json.Unmarshal(b, &in) != nil {
		return nil
	}
	return FromMessages(in.Messages, in.Prompt, blockBytes)
}
