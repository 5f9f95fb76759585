package proxy

import (
	"slices"
	"testing"
	"time"
)

// A drain moves, in the order they started, the streams on its worker
// that can still go on elsewhere, and passes over one whose tool call
// began and one whose continuations are used up (cutting either would
// only end it with an error event); a stream unregistered, or on another
// worker, is not touched.
func TestMove_MovesOnlyStreamsThatCanMove(t *testing.T) {
	var h Handler
	var told []string
	stream := func(name, worker string, canMove bool) (*contStream, func()) {
		cs := &contStream{left: 1}
		cs.canMove.Store(canMove)
		return cs, h.live.add(worker, cs, func(cause error) {
			if cause != errDrained {
				t.Errorf("%s cancelled with %v, want errDrained", name, cause)
			}
			told = append(told, name)
		})
	}
	stream("first", "w0", true)
	tool, _ := stream("tool call", "w0", true)
	data := []byte(`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}`)
	tool.follow(readEvent(data))
	stream("used up", "w0", false)
	_, remove := stream("gone", "w0", true)
	remove()
	stream("elsewhere", "w1", true)
	stream("last", "w0", true)
	if n := h.live.move("w0"); n != 2 || !slices.Equal(told, []string{"first", "last"}) {
		t.Fatalf("moved %d: %v, want first and last, in that order", n, told)
	}
	if tool.stuck == "" {
		t.Fatal("the tool call did not stick the stream")
	}
}

// A drain's deadline moves the streams on its worker when it passes,
// including one that registered after the drain began (a request bound
// to the worker in the instant before it started draining registers only
// once it is sent); stopped before its deadline, it moves none.
func TestDrainAfter_MovesTheStreamsThereAtTheDeadline(t *testing.T) {
	h := New(Options{})
	moved := make(chan string, 4)
	stream := func(name, worker string) {
		cs := &contStream{left: 1}
		cs.canMove.Store(true)
		h.live.add(worker, cs, func(error) { moved <- name })
	}
	stream("before", "w0")
	fire := make(chan time.Time)
	h.DrainAfter("w0", fire)
	stream("after", "w0")
	stream("elsewhere", "w1")
	close(fire)
	var got []string
	for len(got) < 2 {
		select {
		case name := <-moved:
			got = append(got, name)
		case <-time.After(10 * time.Second): // a bound on failure, not a wait
			t.Fatalf("moved only %v within 10s, want before and after", got)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"after", "before"}) {
		t.Fatalf("moved %v, want before and after", got)
	}

	stream("stopped", "w2")
	fire2 := make(chan time.Time)
	h.DrainAfter("w2", fire2)() // stopped before its deadline
	if n := h.live.move("w1"); n != 1 || <-moved != "elsewhere" {
		t.Fatalf("w1: moved %d", n)
	}
	select {
	case name := <-moved:
		t.Fatalf("%s moved by a stopped drain", name)
	default:
	}
}
