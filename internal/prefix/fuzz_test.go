package prefix

import (
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
		a := FromBody(body, 16)
		b := FromBody(body, 16)
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
