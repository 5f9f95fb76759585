package scheduler

import (
	"errors"
	"time"
)

// Outcomes of admission other than a lease. The HTTP layer maps each to a
// status and reason code in one place.
var (
	// ErrQueueFull: the model's queue is at max_queue.
	ErrQueueFull = errors.New("admission queue is full")
	// ErrQueueBytesFull: the waiting requests' bodies reach MaxQueueBytes.
	ErrQueueBytesFull = errors.New("the requests waiting in the admission queue hold as many bytes of request bodies as it keeps")
	// ErrQueueTimeout: the request waited its deadline in the queue.
	ErrQueueTimeout = errors.New("timed out waiting in the admission queue")
	// ErrUnknownModel: no configured worker serves the model.
	ErrUnknownModel = errors.New("no worker serves this model")
	// ErrNoHealthyWorker: workers serve the model, but all are down (or
	// have already failed this request), so waiting would not help.
	ErrNoHealthyWorker = errors.New("no healthy worker serves this model")
	// ErrClientGone: the client went away while the request was queued.
	ErrClientGone = errors.New("client disconnected while queued")
	// ErrClosed: the scheduler is shutting down.
	ErrClosed = errors.New("scheduler is shutting down")
	// ErrPromptTooLong: the prompt exceeds every serving worker's context.
	ErrPromptTooLong = errors.New("the prompt is longer than the context of every worker serving this model")
	// ErrDeadlineUnmeetable: the work queued ahead, at the model's drain
	// rate, would keep the request waiting past its class's deadline.
	ErrDeadlineUnmeetable = errors.New("the request cannot be served within its class's queue deadline")
	// ErrUnknownClass: the request names a class that is not configured.
	ErrUnknownClass = errors.New("unknown priority class")
	// ErrRouteNotServed: no worker of the model serves the request's route.
	ErrRouteNotServed = errors.New("no worker serving this model serves this route")
)

// Refusal is the error Admit returns when it gives no lease. It wraps one
// of the sentinel errors above and carries what the client needs to act.
type Refusal struct {
	// Err is one of the sentinel errors.
	Err error
	// Reason is a stable machine-readable code, e.g. "queue_full".
	Reason string
	// RetryAfter is when trying again is likely to succeed, computed from
	// the queue depth and the drain rate Sluice observes.
	RetryAfter time.Duration
	// DecisionID names the decision record of the refusal.
	DecisionID string
	// QueueWait is how long the request waited before being refused.
	QueueWait time.Duration
}

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// reasons are the stable codes of the sentinel errors.
var reasons = []struct {
	err  error
	code string
}{
	{ErrQueueFull, "queue_full"},
	{ErrQueueBytesFull, "queue_bytes_full"},
	{ErrQueueTimeout, "queue_timeout"},
	{ErrUnknownModel, "model_not_found"},
	{ErrNoHealthyWorker, "no_healthy_worker"},
	{ErrClientGone, "client_gone"},
	{ErrClosed, "shutting_down"},
	{ErrDeadlineUnmeetable, "deadline_unmeetable"},
	{ErrPromptTooLong, "context_length_exceeded"},
	{ErrUnknownClass, "unknown_priority_class"},
	{ErrSLOUnmeetable, "slo_unmeetable"},
	{ErrRouteNotServed, "route_not_served"},
	{ErrAdapterLoad, "adapter_load_failed"},
}

// reasonOf returns the stable code of a sentinel error.
func reasonOf(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.code
		}
	}
	return "internal"
}
