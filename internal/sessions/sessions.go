// Package sessions remembers where each session's latest request went:
// per model and session (a conversation or agent session the client
// named), the worker that served it and the prompt it sent there. The
// scheduler reads it as a hint that the session's next turn finds its
// previous prompt cached on that worker. The table is bounded (least
// recently used out) and forgets a session after a TTL; it is a plain
// value its owner guards.
package sessions

import (
	"container/list"
	"time"
)

// Defaults of a Table.
const (
	DefaultTTL = 30 * time.Minute
	DefaultMax = 65536
)

// Last is where a session's latest request went.
type Last struct {
	Worker string
	Tokens int    // the prompt size of the request
	First  uint64 // its first prefix block's hash, 0 when it had none
	At     time.Time
}

// key is one session of one model.
type key struct{ model, session string }

type entry struct {
	key key
	Last
}

// Table remembers the Last of each session, least recently used first
// out. A nil Table is off: it remembers nothing.
type Table struct {
	ttl time.Duration
	max int
	ll  *list.List // of *entry, most recent first
	m   map[key]*list.Element
}

// New returns a table that forgets a session ttl after its latest
// request and holds at most max; 0 takes the default.
func New(ttl time.Duration, max int) *Table {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if max <= 0 {
		max = DefaultMax
	}
	return &Table{ttl: ttl, max: max, ll: list.New(), m: map[key]*list.Element{}}
}

// Lookup returns where session's latest request for model went, nil when
// the session is unknown, forgotten or empty.
func (t *Table) Lookup(model, session string, now time.Time) *Last {
	if t == nil || session == "" {
		return nil
	}
	el, ok := t.m[key{model, session}]
	if !ok {
		return nil
	}
	e := el.Value.(*entry)
	if now.Sub(e.At) > t.ttl {
		t.ll.Remove(el)
		delete(t.m, e.key)
		return nil
	}
	return &e.Last
}

// Record notes where session's latest request for model went.
func (t *Table) Record(model, session string, last Last) {
	if t == nil || session == "" {
		return
	}
	k := key{model, session}
	if el, ok := t.m[k]; ok {
		el.Value.(*entry).Last = last
		t.ll.MoveToFront(el)
		return
	}
	for t.ll.Len() >= t.max {
		old := t.ll.Remove(t.ll.Back()).(*entry)
		delete(t.m, old.key)
	}
	t.m[k] = t.ll.PushFront(&entry{key: k, Last: last})
}
