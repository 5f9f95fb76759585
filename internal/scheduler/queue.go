package scheduler

import (
	"time"

	"github.com/sluice-router/sluice/internal/fairq"
)

// Class is a priority class of requests: served in priority order,
// bounded by the aging rule (Config.MaxOvertake), with its own deadline.
type Class struct {
	// Name is what a request names (the X-Sluice-Priority header).
	Name string `yaml:"name" json:"name"`
	// Priority orders the classes: lower is served first.
	Priority int `yaml:"priority" json:"priority"`
	// MaxQueueWait is the class's deadline in the queue: a request that
	// cannot be bound within it is refused at once, and one that waits
	// that long times out. 0 takes the queue timeout.
	MaxQueueWait time.Duration `yaml:"max_queue_wait" json:"max_queue_wait,omitempty"`
}

// DefaultClasses are the classes used when none are configured:
// "interactive" (the default class) before "batch".
func DefaultClasses() []Class {
	return []Class{{Name: "interactive", Priority: 0}, {Name: "batch", Priority: 1}}
}

// DefaultMaxOvertake is the aging bound used when Config.MaxOvertake is 0.
const DefaultMaxOvertake = 10 * time.Second

// queue is one model's waiting requests. It exists only while requests
// wait, so client-supplied model names leave no state behind.
type queue struct {
	*fairq.Queue[*Ticket]
	since time.Time // when this backlog began
	spec  bool      // no worker was known to serve the model when it was created
}

// queues are the models' queues, by model: only models with requests
// waiting. The scheduler's lock guards them.
type queues map[string]*queue

// of is model's queue, nil when none waits (a nil queue's Work, Ahead
// and OldestWait are 0).
func (qs queues) of(model string) *fairq.Queue[*Ticket] {
	if q := qs[model]; q != nil {
		return q.Queue
	}
	return nil
}

// unqueue takes a queued ticket out of its model's queue (served: to be
// bound) and deletes the queue when it empties.
func (qs queues) unqueue(t *Ticket, served bool) {
	q := qs[t.req.Model]
	q.Remove(&t.entry, served)
	if q.Len() == 0 {
		delete(qs, t.req.Model)
	}
}

// speculative counts the requests waiting for models no worker was known
// to serve when they came.
func (qs queues) speculative() int {
	n := 0
	for _, q := range qs {
		if q.spec {
			n += q.Len()
		}
	}
	return n
}

// bytes is the sum of the bodies' bytes of the requests waiting.
func (qs queues) bytes() int64 {
	var n int64
	for _, q := range qs {
		n += q.Bytes()
	}
	return n
}
