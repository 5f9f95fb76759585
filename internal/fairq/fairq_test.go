package fairq

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The wait predicted for a request counts a tenant's sessions as sharing
// that tenant's part of the queue: ten sessions of a do not put ten
// shares of work ahead of b's next request.
func TestQueue_AheadCountsSessionsWithinTheirTenant(t *testing.T) {
	q := New[uint64](1)
	var seq uint64
	enqueue := func(tenant, flow string) {
		seq++
		q.Push(&Entry[uint64]{Item: seq, Seq: seq, Tenant: tenant, Flow: flow, Cost: 200}, 1)
	}
	for i := range 10 {
		enqueue("a", fmt.Sprint("s", i))
	}
	enqueue("b", "s0")
	next := &Entry[uint64]{Tenant: "b", Flow: "s0", Cost: 200}
	// b's one request, then as much of a's work: 200 + 200.
	if got, want := q.Ahead(next, 1), 400.0; got != want {
		t.Fatalf("work ahead of b's next request %v tokens, want %v", got, want)
	}
	if got := (*Queue[uint64])(nil).Ahead(next, 1); got != 0 {
		t.Fatalf("work ahead in no queue %v, want 0", got)
	}
}

// Serving a request charges its tenant: the other tenant goes next, and
// within a flow requests go in arrival order. Retries go before all.
func TestQueue_FairShareAndRetries(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := New[string](1)
	var seq uint64
	push := func(name, tenant string, retry bool) *Entry[string] {
		seq++
		e := &Entry[string]{Item: name, Seq: seq, Arrival: t0.Add(time.Duration(seq) * time.Second), Tenant: tenant, Cost: 100, Retry: retry, Bytes: 10}
		q.Push(e, 1)
		return e
	}
	es := []*Entry[string]{push("a1", "a", false), push("a2", "a", false), push("a3", "a", false), push("b1", "b", false), push("r", "a", true)}
	if q.Len() != 5 || q.Bytes() != 50 || q.Work() != 500 || !slices.Equal(q.ByClass(), []int{5}) {
		t.Fatalf("len %d bytes %d work %v by class %v, want 5, 50, 500, [5]", q.Len(), q.Bytes(), q.Work(), q.ByClass())
	}
	if got := q.OldestWait(t0.Add(10 * time.Second)); got != 9*time.Second {
		t.Fatalf("oldest wait %v, want 9s (a1's)", got)
	}
	byName := map[string]*Entry[string]{}
	for _, e := range es {
		byName[e.Item] = e
	}
	var got []string
	for q.Len() > 0 {
		name := q.Head(Order{})
		got = append(got, name)
		q.Remove(byName[name], true)
	}
	if want := []string{"r", "a1", "b1", "a2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if q.Bytes() != 0 || q.Work() != 0 || q.Head(Order{}) != "" {
		t.Fatalf("empty queue: bytes %d work %v head %q", q.Bytes(), q.Work(), q.Head(Order{}))
	}
}

// Behind lists the requests of head's class that came after it within the
// bound, in arrival order, at most max; none behind a retry.
func TestQueue_Behind(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := New[string](2)
	var seq uint64
	push := func(name, flow string, cls, s int) *Entry[string] {
		seq++
		e := &Entry[string]{Item: name, Seq: seq, Arrival: t0.Add(time.Duration(s) * time.Second), Class: cls, Flow: flow}
		q.Push(e, 1)
		return e
	}
	head := push("head", "x", 1, 0)
	push("y1", "y", 1, 1)
	push("x1", "x", 1, 2)
	push("other class", "z", 0, 3)
	push("late", "y", 1, 20)
	if got, want := q.Behind(head, 10*time.Second, 5), []string{"y1", "x1"}; !slices.Equal(got, want) {
		t.Fatalf("behind %v, want %v", got, want)
	}
	if got, want := q.Behind(head, 10*time.Second, 1), []string{"y1"}; !slices.Equal(got, want) {
		t.Fatalf("behind at most 1: %v, want %v", got, want)
	}
	retry := &Entry[string]{Item: "retry", Seq: 99, Retry: true}
	q.Push(retry, 1)
	if got := q.Behind(retry, time.Hour, 5); len(got) != 0 {
		t.Fatalf("behind a retry %v, want none", got)
	}
	var all []string
	for name := range q.All() {
		all = append(all, name)
	}
	slices.Sort(all)
	if want := []string{"head", "late", "other class", "retry", "x1", "y1"}; !slices.Equal(all, want) {
		t.Fatalf("all %v, want %v", all, want)
	}
}
