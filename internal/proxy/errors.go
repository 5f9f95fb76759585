package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// errorBody is the OpenAI error shape. Param names the request field the
// error is about, null when it is about no one field.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func errorJSON(code, typ, param, msg string) []byte {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = msg, typ, code
	if param != "" {
		b.Error.Param = &param
	}
	out, _ := json.Marshal(b)
	return out
}

// writeOpenAIError writes an OpenAI-style error with status and a
// machine-readable reason, in the body and in X-Sluice-Reason; param
// names the request field it is about ("" for none). It returns status
// and reason for the caller's accounting.
func writeOpenAIError(w http.ResponseWriter, status int, reason, param, msg string) (int, string) {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status >= 500:
		typ = "server_error"
	}
	return writeJSONError(w, status, reason, errorJSON(reason, typ, param, msg))
}

// writeJSONError answers with status and an error body, naming reason
// in X-Sluice-Reason.
func writeJSONError(w http.ResponseWriter, status int, reason string, body []byte) (int, string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Sluice-Reason", reason)
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
	return status, reason
}

// WriteError is writeOpenAIError for other packages of Sluice that
// answer with the same error shape.
func WriteError(w http.ResponseWriter, status int, reason, msg string) {
	writeOpenAIError(w, status, reason, "", msg)
}

// StatusOf maps an admission outcome to its HTTP status; the virtual-time
// simulation reports refusals with it too.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, scheduler.ErrQueueFull), errors.Is(err, scheduler.ErrQueueBytesFull):
		return http.StatusTooManyRequests
	case errors.Is(err, scheduler.ErrQueueTimeout), errors.Is(err, scheduler.ErrNoHealthyWorker), errors.Is(err, scheduler.ErrClosed),
		errors.Is(err, scheduler.ErrDeadlineUnmeetable), errors.Is(err, scheduler.ErrSLOUnmeetable):
		return http.StatusServiceUnavailable
	case errors.Is(err, scheduler.ErrUnknownClass), errors.Is(err, scheduler.ErrPromptTooLong):
		return http.StatusBadRequest
	case errors.Is(err, scheduler.ErrUnknownModel), errors.Is(err, scheduler.ErrRouteNotServed):
		return http.StatusNotFound
	case errors.Is(err, scheduler.ErrClientGone):
		return 499 // nginx's "client closed request"; nobody reads it
	case errors.Is(err, scheduler.ErrAdapterLoad):
		return http.StatusBadGateway // the workers failed the load
	}
	return http.StatusInternalServerError
}

// writeRefusal answers a request for model the scheduler refused.
func writeRefusal(p *protocol, w http.ResponseWriter, err error, model string) (int, string) {
	status := StatusOf(err)
	var ref *scheduler.Refusal
	if !errors.As(err, &ref) {
		return p.writeError(w, status, "internal", "", err.Error())
	}
	if ref.DecisionID != "" {
		w.Header().Set("X-Sluice-Decision", ref.DecisionID)
	}
	w.Header().Set("X-Sluice-Queue-Ms", strconv.FormatInt(ref.QueueWait.Milliseconds(), 10))
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ref.RetryAfter.Seconds()))))
	}
	msg := ref.Error()
	switch ref.Reason {
	case "model_not_found":
		msg = fmt.Sprintf("model %q is not served by any worker (GET /v1/models lists those that are)", model)
	case "adapter_load_failed":
		// The load's error is the worker's, logged where it failed.
		msg = fmt.Sprintf("the LoRA adapter %q could not be loaded on any worker", model)
	}
	return p.writeError(w, status, ref.Reason, "", msg)
}

// failureText words what a client is told when its request fails after
// admission: what failed in its terms (its model; no worker answered, or
// the answer broke off and how) and the decision that placed it, the key
// to the logs where the detail is. It tells nothing of the network behind
// Sluice (no worker name or address, no Go error, no worker's own error
// answer): that would show a client where the workers are and what they
// run, and give it nothing to act on.
type failureText struct {
	model    string
	decision string // "" without decision records
}

// failureOf is the failure text of a request for model placed by d.
func failureOf(model string, d *decisions.Record) failureText {
	return failureText{model: model, decision: decisionID(d)}
}

// decisionID is d's ID, "" for none.
func decisionID(d *decisions.Record) string {
	if d == nil {
		return ""
	}
	return d.ID
}

// noAnswer is the message of the 502 for a request every worker tried
// failed before answering.
func (f failureText) noAnswer() string {
	return f.say("no worker could answer" + f.forModel() + ": every worker tried failed before answering")
}

// streamEnd is the message of the error event that ends a stream broken
// for good: reason is the break's (breakUpstream and the others), err
// what broke it. A stream the router's shutdown cut gets shutdownMessage,
// which tells the client to send the request again.
func (f failureText) streamEnd(reason string, err error) string {
	var what string
	switch {
	case reason == breakShutdown:
		return shutdownMessage
	case reason == breakIdle || errors.Is(err, ErrStreamIdle):
		what = "stalled: its worker sent nothing for longer than the stream idle timeout"
	case reason == breakErrorEvent:
		what = "broke off: its worker reported an error mid-stream"
	case reason == breakDrain:
		what = "broke off: its worker was taken out of service mid-stream"
	case errors.Is(err, ErrStreamTruncated):
		what = "ended early: its worker's stream stopped before its end"
	default:
		what = "broke off: its worker's stream failed mid-way"
	}
	return f.say("the answer" + f.forModel() + " " + what)
}

func (f failureText) forModel() string {
	if f.model == "" {
		return ""
	}
	return fmt.Sprintf(" for model %q", f.model)
}

// say ends msg with the decision, when there is one.
func (f failureText) say(msg string) string {
	if f.decision == "" {
		return msg
	}
	return msg + " (decision " + f.decision + ")"
}
