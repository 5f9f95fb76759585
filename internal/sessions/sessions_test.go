package sessions

import (
	"testing"
	"time"
)

// A session is forgotten after the TTL, and the table holds at most its
// bound, the least recently used going first.
func TestTable_IsBounded(t *testing.T) {
	tb := New(time.Minute, 2)
	t0 := time.Unix(1000, 0)
	tb.Record("m", "a", Last{Worker: "w0", Tokens: 10, At: t0})
	tb.Record("m", "b", Last{Worker: "w1", Tokens: 10, At: t0})
	tb.Record("m", "c", Last{Worker: "w0", Tokens: 10, At: t0}) // evicts a
	if tb.ll.Len() != 2 || tb.Lookup("m", "a", t0) != nil {
		t.Fatalf("after 3 sessions in a table of 2: %d kept, a found %v", tb.ll.Len(), tb.Lookup("m", "a", t0) != nil)
	}
	if e := tb.Lookup("m", "b", t0.Add(30*time.Second)); e == nil || e.Worker != "w1" {
		t.Fatalf("b within its TTL: %+v", e)
	}
	if e := tb.Lookup("m", "c", t0.Add(2*time.Minute)); e != nil {
		t.Fatalf("c past its TTL still found: %+v", e)
	}
	if e := tb.Lookup("n", "b", t0); e != nil {
		t.Fatalf("session b of another model found: %+v", e)
	}
	// A later request of b moves it to the front: y evicts x, not b.
	t1 := t0.Add(time.Second)
	tb.Record("m", "x", Last{Worker: "w0", Tokens: 10, At: t1})
	tb.Record("m", "b", Last{Worker: "w2", Tokens: 20, At: t1})
	tb.Record("m", "y", Last{Worker: "w0", Tokens: 10, At: t1})
	if e := tb.Lookup("m", "b", t1); e == nil || e.Worker != "w2" || e.Tokens != 20 || tb.Lookup("m", "x", t1) != nil {
		t.Fatalf("b after its second request: %+v; x found %v", e, tb.Lookup("m", "x", t1) != nil)
	}
	var off *Table
	off.Record("m", "a", Last{Worker: "w0"})
	if off.Lookup("m", "a", t0) != nil {
		t.Fatal("a nil table remembered a session")
	}
}
