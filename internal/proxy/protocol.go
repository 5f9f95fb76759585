package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// protocol is what differs between the APIs Sluice routes: how a body is
// read, what shape an error takes, how a stream's events are read and
// how a stream that fails is ended. Everything else — admission, retries,
// the relay, the finish sequence — is one implementation for all.
type protocol struct {
	// name names the API in logs.
	name string
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
	// read reads one event of a stream; nil reads OpenAI chunks
	// (readEvent).
	read func(typ, data []byte) eventInfo
}

// protocols by route; a route not listed is OpenAI's.
var (
	openAI = &protocol{
		name:        "openai",
		parse:       func(b []byte) (parsed, error) { return parseInference(b, true) },
		writeError:  writeParamError,
		streamError: openAIStreamError,
	}
	// chat and completions are OpenAI's, with the messages or the prompt
	// their requests must hold.
	chat = &protocol{
		name:        "openai",
		parse:       parseChat,
		writeError:  writeParamError,
		streamError: openAIStreamError,
	}
	completions = &protocol{
		name:        "openai",
		parse:       func(b []byte) (parsed, error) { return parseCompletion(b, true) },
		writeError:  writeParamError,
		streamError: openAIStreamError,
	}
	// native is llama.cpp's own /rerank, and nativeCompletion its own
	// /completion: model optional.
	native = &protocol{
		name:        "llama.cpp",
		parse:       func(b []byte) (parsed, error) { return parseInference(b, false) },
		writeError:  writeParamError,
		streamError: openAIStreamError,
	}
	nativeCompletion = &protocol{
		name:        "llama.cpp",
		parse:       func(b []byte) (parsed, error) { return parseCompletion(b, false) },
		writeError:  writeParamError,
		streamError: openAIStreamError,
	}
	// responses is OpenAI's Responses API: OpenAI's errors, but typed
	// stream events ending at response.completed, with no [DONE].
	responses = &protocol{
		name:        "openai responses",
		parse:       func(b []byte) (parsed, error) { return parseInference(b, true) },
		writeError:  writeParamError,
		streamError: openAIStreamError,
		read:        readResponsesEvent,
	}
	anthropicMessages = &protocol{
		name:        "anthropic",
		route:       "/v1/messages",
		parse:       func(b []byte) (parsed, error) { return parseMessages(b, false) },
		writeError:  writeAnthropicError,
		streamError: anthropicStreamError,
		read:        readAnthropicEvent,
	}
	anthropicCount = &protocol{
		name:        "anthropic",
		route:       "/v1/messages/count_tokens",
		parse:       func(b []byte) (parsed, error) { return parseMessages(b, true) },
		writeError:  writeAnthropicError,
		streamError: anthropicStreamError,
		read:        readAnthropicEvent,
	}
)

// protocolFor returns the protocol of a request path.
func protocolFor(path string) *protocol {
	switch path {
	case "/v1/chat/completions":
		return chat
	case "/v1/completions":
		return completions
	case "/completion":
		return nativeCompletion
	case "/rerank":
		return native
	case "/v1/responses":
		return responses
	case "/v1/messages":
		return anthropicMessages
	case "/v1/messages/count_tokens":
		return anthropicCount
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

// StatusOverloaded is Anthropic's 529, "overloaded_error": the API is
// temporarily overloaded. Its SDKs retry it, as they retry 429 and 5xx.
const StatusOverloaded = 529

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
		return StatusOverloaded, "overloaded_error"
	case status == http.StatusTooManyRequests:
		return status, "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return StatusOverloaded, "overloaded_error"
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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Sluice-Reason", reason)
	w.WriteHeader(status)
	w.Write(append(anthropicErrorJSON(typ, msg), '\n'))
	return status, reason
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

// writeStreamEnd ends a broken stream with p's error event.
func writeStreamEnd(p *protocol, w io.Writer, rc *http.ResponseController, code, msg string) {
	w.Write(p.streamError(code, msg))
	rc.Flush()
}
