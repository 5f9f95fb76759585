package sse

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// reference parses a whole stream the way the standard's text reads,
// line by line, with none of Parser's incremental machinery, and
// dispatches a pending event at the end as Parser.End does.
func reference(in string) []ev {
	in = strings.TrimPrefix(in, bom)
	var lines []string
	for len(in) > 0 {
		i := strings.IndexAny(in, "\r\n")
		if i < 0 {
			lines = append(lines, in)
			break
		}
		lines = append(lines, in[:i])
		if strings.HasPrefix(in[i:], "\r\n") {
			i++
		}
		in = in[i+1:]
	}
	lines = append(lines, "") // the end dispatches what is pending
	var out []ev
	var data, typ, id string
	has := false
	for _, l := range lines {
		if l == "" {
			if has {
				out = append(out, ev{typ, strings.TrimSuffix(data, "\n"), id})
			}
			data, typ, has = "", "", false
			continue
		}
		if l[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(l, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			data += value + "\n"
			has = true
		case "event":
			typ = value
		case "id":
			if !strings.Contains(value, "\x00") {
				id = value
			}
		}
	}
	return out
}

// FuzzParser holds Parser to the reference reading of the standard, fed
// whole and in pieces of every size the input picks: what is dispatched
// must not depend on how reads split the stream.
func FuzzParser(f *testing.F) {
	f.Add("data: a\ndata: b\n\n", 1)
	f.Add("event: error\r\ndata: {\"error\":1}\r\n\r\n: c\rid: 3\rdata\r\r", 2)
	f.Add("\xEF\xBB\xBFdata: x", 1)
	f.Add("\xEF\xBBdata: x\n\n", 1)
	f.Add("data: [DONE]\n\n", 5)
	f.Fuzz(func(t *testing.T, in string, size int) {
		want := reference(in)
		for _, n := range []int{0, 1, 1 + size&63} {
			var p Parser
			if diff := cmp.Diff(want, parse(&p, in, n)); diff != "" {
				t.Fatalf("%q fed %d at a time (-reference +parser):\n%s", in, n, diff)
			}
		}
	})
}
