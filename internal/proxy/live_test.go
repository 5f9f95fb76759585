package proxy

import (
	"slices"
	"testing"
)

// A drain moves, in the order they started, the streams on its worker
// that can still go on elsewhere, and passes over one whose tool call
// began and one whose continuations are used up (cutting either would
// only end it with an error event); a stream unregistered, or on another
// worker, is not touched.
func TestContinueElsewhere_MovesOnlyStreamsThatCanMove(t *testing.T) {
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
	tool.follow(data, readEvent(data))
	stream("used up", "w0", false)
	_, remove := stream("gone", "w0", true)
	remove()
	stream("elsewhere", "w1", true)
	stream("last", "w0", true)
	if n := h.ContinueElsewhere("w0"); n != 2 || !slices.Equal(told, []string{"first", "last"}) {
		t.Fatalf("moved %d: %v, want first and last, in that order", n, told)
	}
	if tool.stuck == "" {
		t.Fatal("the tool call did not stick the stream")
	}
}
