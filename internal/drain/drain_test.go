package drain

import (
	"testing"
	"time"
)

// A rate is learned from the completions of one backlog after its first,
// over windows of at least a second; a new backlog starts a fresh window
// and keeps what was learned.
func TestRate_MeasuredWithinABacklog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	if _, ok := (*Rate)(nil).TimeFor(100); ok {
		t.Fatal("no rate measured: TimeFor must say so")
	}
	var r Rate
	r.Drained(500, t0, at(1)) // the first completion of the backlog only starts the window
	if _, ok := r.TimeFor(100); ok {
		t.Fatal("the first completion gave a rate")
	}
	r.Drained(100, t0, at(1.5)) // under a second: no sample yet
	if _, ok := r.TimeFor(100); ok {
		t.Fatal("a window under a second gave a rate")
	}
	r.Drained(100, t0, at(3)) // 200 tokens over 2s
	if d, ok := r.TimeFor(400); !ok || d != 4*time.Second {
		t.Fatalf("time for 400 tokens %v %v, want 4s at 100 tokens/s", d, ok)
	}
	// An idle hour, then a new backlog: its first completion starts a
	// fresh window, the hour counts for nothing.
	r.Drained(10_000, at(3600), at(3601))
	if d, ok := r.TimeFor(400); !ok || d != 4*time.Second {
		t.Fatalf("after an idle spell %v %v, want the rate measured under backlog", d, ok)
	}
}
