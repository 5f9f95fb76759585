package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// protocol is what differs between the APIs Sluice routes: how a body is
// read, what shape an error takes, how a stream's events are read and
// how a stream that fails is ended. Everything else — admission, retries,
// the relay, the finish sequence — is one implementation for all.
type protocol struct {
	// route is the client route a worker must serve (Request.Route), ""
	// for the routes every engine serves.
	route string
	// parse validates a body; its error is a *badRequest.
	parse func(body []byte) (parsed, error)
	// writeError answers with an error in the API's shape (param names
	// the field it is about, "" for none), and X-Sluice-Reason.
	writeError func(w http.ResponseWriter, status int, reason, param, msg string) (int, string)
	// streamError is the event that ends a stream the worker broke.
	streamError func(code, msg string) []byte
	// read reads one event's data of a stream.
	read func(data []byte) eventInfo
}

// openAIProtocol is an OpenAI-shaped API whose bodies parseInference
// reads: needModel is false for llama.cpp's native routes, check is what
// the route's requests must hold beside the model (nil for nothing), and
// read reads its stream's events.
func openAIProtocol(needModel bool, check func(*inference) error, read func([]byte) eventInfo) *protocol {
	return &protocol{
		parse:       func(b []byte) (parsed, error) { return parseInference(b, needModel, check) },
		writeError:  writeOpenAIError,
		streamError: openAIStreamError,
		read:        read,
	}
}

// anthropicProtocol is the Messages API on route; countTokens for
// count_tokens, whose body has no max_tokens.
func anthropicProtocol(route string, countTokens bool) *protocol {
	return &protocol{
		route:       route,
		parse:       func(b []byte) (parsed, error) { return parseMessages(b, countTokens) },
		writeError:  writeAnthropicError,
		streamError: anthropicStreamError,
		read:        readAnthropicEvent,
	}
}

// openAI is the protocol of a route protocols does not list.
var openAI = openAIProtocol(true, nil, readEvent)

// protocols by route. Chat and completions requests must hold messages
// or a prompt; llama.cpp's own /completion and /rerank need no model.
// The Responses API has OpenAI's errors, but typed stream events ending
// at response.completed, with no [DONE].
var protocols = map[string]*protocol{
	"/v1/chat/completions":      openAIProtocol(true, requireMessages, readEvent),
	"/v1/completions":           openAIProtocol(true, requirePrompt, readEvent),
	"/completion":               openAIProtocol(false, requirePrompt, readEvent),
	"/rerank":                   openAIProtocol(false, nil, readEvent),
	"/v1/responses":             openAIProtocol(true, nil, readResponsesEvent),
	"/v1/messages":              anthropicProtocol("/v1/messages", false),
	"/v1/messages/count_tokens": anthropicProtocol("/v1/messages/count_tokens", true),
}

// protocolFor returns the protocol of a request path.
func protocolFor(path string) *protocol {
	if p, ok := protocols[path]; ok {
		return p
	}
	return openAI
}

func openAIStreamError(code, msg string) []byte {
	return fmt.Appendf(nil, "data: %s\n\n", errorJSON(code, "server_error", "", msg))
}

// anthropicErrorBody is Anthropic's error shape.
type anthropicErrorBody struct {
	Type  string `json:"type"` // "error"
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func anthropicErrorJSON(typ, msg string) []byte {
	var b anthropicErrorBody
	b.Type, b.Error.Type, b.Error.Message = "error", typ, msg
	out, _ := json.Marshal(b)
	return out
}

// statusOverloaded is Anthropic's 529, "overloaded_error": the API is
// temporarily overloaded. Its SDKs retry it, as they retry 429 and 5xx.
const statusOverloaded = 529

// anthropicStatus maps a refusal, as Sluice's OpenAI-shaped answers state
// it (status and reason), to Anthropic's status and error type. A full
// queue and every refusal for want of capacity (a queue timeout, a
// deadline or SLO that cannot be met, no healthy worker, shutting down)
// are 529 overloaded_error, where the OpenAI routes answer 429 or 503:
// that is the error Anthropic's own API gives when it cannot take a
// request, and clients built for it back off on it. A key's own rate or
// concurrency limit stays 429 rate_limit_error.
func anthropicStatus(status int, reason string) (int, string) {
	switch {
	case status == http.StatusTooManyRequests && (reason == "queue_full" || reason == "queue_bytes_full"):
		return statusOverloaded, "overloaded_error"
	case status == http.StatusTooManyRequests:
		return status, "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return statusOverloaded, "overloaded_error"
	case status == http.StatusUnauthorized:
		return status, "authentication_error"
	case status == http.StatusForbidden:
		return status, "permission_error"
	case status == http.StatusNotFound:
		return status, "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return status, "request_too_large"
	case status >= 500:
		return status, "api_error"
	}
	return status, "invalid_request_error"
}

// writeAnthropicError writes an error in Anthropic's shape:
// {"type":"error","error":{"type":…,"message":…}}, with Sluice's reason
// in X-Sluice-Reason. param, when set, is named in the message.
func writeAnthropicError(w http.ResponseWriter, status int, reason, param, msg string) (int, string) {
	status, typ := anthropicStatus(status, reason)
	if param != "" && !strings.HasPrefix(msg, param) {
		msg = param + ": " + msg
	}
	return writeJSONError(w, status, reason, anthropicErrorJSON(typ, msg))
}

// anthropicStreamError is Anthropic's mid-stream error event.
func anthropicStreamError(code, msg string) []byte {
	typ := "api_error"
	if code == "stream_idle" || code == "shutting_down" {
		typ = "overloaded_error"
	}
	return fmt.Appendf(nil, "event: error\ndata: %s\n\n", anthropicErrorJSON(typ, msg))
}

// WriteErrorFor is WriteError in the shape of the API at path: Anthropic's
// for /v1/messages, OpenAI's elsewhere. The guard answers with it.
func WriteErrorFor(w http.ResponseWriter, path string, status int, reason, msg string) {
	protocolFor(path).writeError(w, status, reason, "", msg)
}
