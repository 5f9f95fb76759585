package serial

import (
	"slices"
	"sync"
	"testing"
)

// Calls of one key are made in the order pushed, one at a time, and Wait
// returns once every call, and every call a call pushed, has been made.
func TestRunner_InOrderPerKeyAndWait(t *testing.T) {
	var r Runner
	var mu sync.Mutex
	got := map[string][]int{}
	record := func(key string, i int) func() {
		return func() {
			mu.Lock()
			got[key] = append(got[key], i)
			mu.Unlock()
		}
	}
	gate := make(chan struct{})
	r.Push("a", func() { <-gate }) // holds a's later calls back, not b's
	for i := range 5 {
		r.Push("a", record("a", i))
		r.Push("b", record("b", i))
	}
	r.Push("b", func() { r.Push("b", record("b", 5)) })
	done := make(chan struct{})
	go func() { r.Wait(); close(done) }()
	select {
	case <-done:
		t.Fatal("Wait returned while a call was blocked")
	default:
	}
	close(gate)
	<-done
	if want := []int{0, 1, 2, 3, 4}; !slices.Equal(got["a"], want) {
		t.Fatalf("a's calls %v, want %v", got["a"], want)
	}
	if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(got["b"], want) {
		t.Fatalf("b's calls %v, want %v", got["b"], want)
	}
}
