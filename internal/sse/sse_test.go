package sse

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ev is an Event with its slices copied, for comparing.
type ev struct{ Type, Data, ID string }

// parse feeds in to a Parser in pieces of at most size bytes (all at
// once when size is 0), ends it, and returns the events dispatched.
func parse(p *Parser, in string, size int) []ev {
	var out []ev
	fn := func(e Event) { out = append(out, ev{string(e.Type), string(e.Data), string(e.ID)}) }
	for len(in) > 0 {
		n := len(in)
		if size > 0 {
			n = min(n, size)
		}
		p.Feed([]byte(in[:n]), fn)
		in = in[n:]
	}
	p.End(fn)
	return out
}

func TestParser_FollowsTheStandard(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []ev
	}{
		{"one event", "data: x\n\n", []ev{{"", "x", ""}}},
		{"data lines joined with LF", "data: a\ndata: b\ndata\n\n", []ev{{"", "a\nb\n", ""}}},
		{"one leading space stripped, no more", "data:  x\ndata:y\n\n", []ev{{"", " x\ny", ""}}},
		{"comments ignored", ": keep-alive\ndata: x\n:\n\n", []ev{{"", "x", ""}}},
		{"CRLF, CR and LF line ends", "data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r", []ev{{"", "a\nb\nc", ""}, {"", "d", ""}}},
		{"event type, reset after dispatch", "event: error\ndata: x\n\ndata: y\n\n", []ev{{"error", "x", ""}, {"", "y", ""}}},
		{"no data, no event; its type is dropped", "event: ping\n\ndata: y\n\n", []ev{{"", "y", ""}}},
		{"id persists", "id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n", []ev{{"", "a", "7"}, {"", "b", "7"}, {"", "c", ""}}},
		{"id with NUL ignored", "id: 1\n\nid: a\x00b\ndata: x\n\n", []ev{{"", "x", "1"}}},
		{"unknown fields and retry ignored", "foo: bar\nretry: 10\ndata: x\n\n", []ev{{"", "x", ""}}},
		{"empty data still an event", "data:\n\n", []ev{{"", "", ""}}},
		{"leading BOM skipped", "\xEF\xBB\xBFdata: x\n\n", []ev{{"", "x", ""}}},
		{"BOM only at the start", "data: x\n\n\xEF\xBB\xBFdata: y\n\n", []ev{{"", "x", ""}}},
		{"pending event dispatched at the end", "data: a\n\ndata: b", []ev{{"", "a", ""}, {"", "b", ""}}},
		{"[DONE] is data like any other", "data: [DONE]\n\n", []ev{{"", "[DONE]", ""}}},
		{"field without colon", "data\n\n", []ev{{"", "", ""}}},
	}
	for _, tt := range tests {
		for _, size := range []int{0, 1, 2, 3, 7} {
			var p Parser
			if diff := cmp.Diff(tt.want, parse(&p, tt.in, size)); diff != "" {
				t.Errorf("%s, fed %d bytes at a time (-want +got):\n%s", tt.name, size, diff)
			}
		}
	}
}

func TestParser_FeedReportsEventEnds(t *testing.T) {
	var p Parser
	fn := func(Event) {}
	for _, tt := range []struct {
		in   string
		want bool
	}{{"data: a\n", false}, {"\n", true}, {"data: b", false}, {"\r", false}, {"\n", false}, {"\r\n", true}} {
		if got := p.Feed([]byte(tt.in), fn); got != tt.want {
			t.Fatalf("Feed(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestParser_BoundsWhatItKeeps(t *testing.T) {
	p := Parser{Max: 16}
	long := strings.Repeat("x", 40)
	in := "data: " + long + "\n\n" + "data: ok\n\n" + "data: 0123456789\ndata: 0123456789\n\n" + "data: fine\n\n"
	for _, size := range []int{0, 5} {
		got := parse(&p, in, size)
		if diff := cmp.Diff([]ev{{"", "ok", ""}, {"", "fine", ""}}, got); diff != "" {
			t.Fatalf("fed %d at a time (-want +got):\n%s", size, diff)
		}
		if cap(p.line) > 16 || cap(p.data) > 32 {
			t.Fatalf("kept %d bytes of line, %d of data; Max 16", cap(p.line), cap(p.data))
		}
	}
	if p.Dropped != 4 {
		t.Fatalf("Dropped %d, want 4 (one long line, one long event, twice)", p.Dropped)
	}
}

func BenchmarkParser(b *testing.B) {
	chunk := []byte(`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" thro"}}],"created":1796323427,"id":"chatcmpl-Kj3f6oSDxsIEEZiKY9pRALLSyf6RFCfL","model":"m","object":"chat.completion.chunk"}` + "\n\n")
	var p Parser
	n := 0
	fn := func(e Event) { n += len(e.Data) }
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		p.Feed(chunk, fn)
	}
	if n == 0 {
		b.Fatal("no events")
	}
}

// Next points just past the blank line that ended each event Feed
// dispatches, in the bytes of that Feed, however the stream is split
// across Feeds: forwarding up to it forwards whole events only.
func TestParser_NextIsJustPastTheEventsEnd(t *testing.T) {
	stream := "data: a\n\n: note\r\ndata: b\r\n\r\nevent: x\rdata: c\r\rdata: tail"
	ends := []int{9, 28, 46} // offsets in stream just past each blank line
	for split := 0; split <= len(stream); split++ {
		var p Parser
		var got []int
		for off, part := range []string{stream[:split], stream[split:]} {
			base := 0
			if off == 1 {
				base = split
			}
			p.Feed([]byte(part), func(e Event) { got = append(got, base+e.Next) })
		}
		var tail []int
		p.End(func(e Event) { tail = append(tail, e.Next) })
		want := ends
		if split == 27 { // a CRLF split after its CR: the CR ends the event
			want = []int{9, 27, 46}
		}
		if !slices.Equal(got, want) || !slices.Equal(tail, []int{0}) {
			t.Fatalf("split at %d: events ended at %v (End: %v), want %v (End: [0])", split, got, tail, want)
		}
	}
}
