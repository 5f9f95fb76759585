package scheduler

import (
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/prefix"
)

// A session's next request goes back to the worker that served its last
// one, even with no prompt blocks to match, among equally loaded workers;
// the record names the hint and where the key came from, never the key.
func TestSessions_HintSendsASessionBackToItsWorker(t *testing.T) {
	for _, on := range []bool{false, true} {
		idx := prefix.NewIndex(prefix.Options{})
		s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx, SessionAffinity: on}, workers(2, 4, "m")...)
		first := Request{Model: "m", PromptTokens: 90, Session: "5e55104e1d", SessionSource: "header x-session-id"}
		admitNow(t, s, first).Release() // w0, listed first
		next := first
		next.PromptTokens = 100
		l := admitNow(t, s, next)
		want := "w1" // least recently picked, without the hint
		if on {
			want = "w0"
		}
		if l.Worker != want {
			t.Fatalf("affinity %v: the session's next request went to %s, want %s", on, l.Worker, want)
		}
		r := l.Decision.Explain()
		if r.Session != "header x-session-id #5e55104e" {
			t.Errorf("record's session %q, want the source and 8 characters of the digest", r.Session)
		}
		if on {
			term := termOf(t, r.Candidates[0], "prefix")
			if term.Raw != 0.9 || !strings.Contains(term.Source, "session hint") || !strings.Contains(term.Source, "header x-session-id") {
				t.Errorf("w0's prefix term %+v; want raw 0.9 (90 of 100 tokens) from the session hint, naming the header", term)
			}
		}
		l.Release()
		if !on {
			continue
		}
		// A shorter prompt under the same key is not a continuation, nor
		// one that starts elsewhere: no hint.
		for _, other := range []Request{
			{Model: "m", PromptTokens: 50, Session: first.Session},
			{Model: "m", PromptTokens: 200, Prefix: []uint64{7, 8}, Session: first.Session},
		} {
			admitNow(t, s, Request{Model: "m", PromptTokens: 200, Prefix: []uint64{1, 2}, Session: first.Session}).Release()
			l := admitNow(t, s, other)
			if c := termOf(t, l.Decision.Explain().Candidates[0], "prefix"); c.Raw != 0 {
				t.Errorf("%+v after a 200-token prompt starting with block 1: hint %v, want none", other, c.Raw)
			}
			l.Release()
		}
	}
}

// The hint weighs what a prefix match weighs: a session whose worker is
// busy goes to an idle worker instead of piling onto its own.
func TestSessions_HintDoesNotHerdOntoABusyWorker(t *testing.T) {
	idx := prefix.NewIndex(prefix.Options{})
	s := newSched(t, Config{MaxQueue: 10, PrefixIndex: idx, SessionAffinity: true}, workers(2, 4, "m")...)
	sess := Request{Model: "m", PromptTokens: 100, Session: "abc", SessionSource: "prompt_cache_key"}
	admitNow(t, s, sess).Release() // w0
	busy := admitNow(t, s, Request{Model: "m"})
	if busy.Worker != "w1" {
		t.Fatalf("filler went to %s, want w1", busy.Worker)
	}
	busy2 := admitNow(t, s, Request{Model: "m"}) // w0 now has one in flight
	if busy2.Worker != "w0" {
		t.Fatalf("second filler went to %s, want w0", busy2.Worker)
	}
	busy.Release() // w1 idle, w0 busy
	l := admitNow(t, s, sess)
	if l.Worker != "w1" {
		t.Fatalf("session went to %s with its worker busy and another idle; want w1", l.Worker)
	}
	l.Release()
	busy2.Release()
}

// With fair share by session, two sessions of one tenant share the queue
// as two tenants would: the one with a backlog does not starve the other.
func TestSessions_FlowSharesTheQueue(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 10}, workers(1, 1, "m")...)
	hold := admitNow(t, s, Request{Model: "m"})
	var a []*Ticket
	for range 3 {
		a = append(a, s.Submit(Request{Model: "m", Tenant: "t", Flow: "t/sa", PromptTokens: 100}, nil))
	}
	b := s.Submit(Request{Model: "m", Tenant: "t", Flow: "t/sb", PromptTokens: 100}, nil)
	hold.Release()
	<-a[0].Wait()
	l, _ := a[0].Result()
	l.Release()
	<-b.Wait()
	if a[1].Done() {
		t.Fatal("session a's second request went before session b's first: no fair share between sessions")
	}
	l, _ = b.Result()
	l.Release()
	for _, tk := range a[1:] {
		<-tk.Wait()
		l, _ := tk.Result()
		l.Release()
	}
}
