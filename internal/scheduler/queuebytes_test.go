package scheduler

import (
	"errors"
	"testing"
)

// The bytes waiting requests hold are counted in as they queue and out
// as they leave it, however they leave: bound, cancelled or refused. A
// retry, accepted before, is never refused for them.
func TestQueueBytes_CountedInAndOutOfTheQueue(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10, MaxQueueBytes: 100}, workers(1, 1, "m")...)
	held, err := s.Submit(Request{Model: "m", BodyBytes: 1000}, nil).Result() // bound at once: not counted
	if err != nil {
		t.Fatal(err)
	}
	a := s.Submit(Request{Model: "m", BodyBytes: 60}, nil)
	refused := func(body int, attempt int) bool {
		t.Helper()
		tk := s.Submit(Request{Model: "m", BodyBytes: body, Attempt: attempt}, nil)
		if tk.Done() {
			_, err := tk.Result()
			if !errors.Is(err, ErrQueueBytesFull) {
				t.Fatalf("refused with %v, want ErrQueueBytesFull", err)
			}
			var ref *Refusal
			if errors.As(err, &ref); ref.Reason != "queue_bytes_full" || ref.RetryAfter <= 0 {
				t.Fatalf("refusal %+v, want reason queue_bytes_full and a Retry-After", ref)
			}
			return true
		}
		s.Cancel(tk, ErrClientGone)
		return false
	}
	if !refused(50, 1) {
		t.Fatal("60 + 50 bytes queued with a budget of 100")
	}
	if refused(40, 1) {
		t.Fatal("60 + 40 bytes refused with a budget of 100")
	}
	if refused(50, 2) {
		t.Fatal("a retry was refused for the bytes queued")
	}
	s.Cancel(a, ErrClientGone)
	b := s.Submit(Request{Model: "m", BodyBytes: 100}, nil) // the cancelled one's bytes are back
	if b.Done() {
		t.Fatal("100 bytes refused with nothing queued")
	}
	held.Release() // b is bound: its bytes leave the queue
	if l, err := b.Result(); err != nil {
		t.Fatal(err)
	} else {
		defer l.Release()
	}
	if refused(100, 1) {
		t.Fatal("100 bytes refused once the queue emptied")
	}
}
