package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Continuation: a stream whose worker breaks it after the first byte — the
// connection cut or at EOF before its terminator, an error event, no byte
// for IdleTimeout, or a drain deadline — is continued on another worker
// instead of ending with an error event. The new worker is asked for the
// rest of the answer: the original request plus the text the client was
// already sent, its token limits lowered by the tokens sent; its events
// are rewritten into the first stream's (its id, no second role chunk, one
// final usage adding both parts), so the client reads one uninterrupted
// stream. How to ask for the rest is each engine's own:
//
//   - /v1/completions and llama.cpp's /completion: the sent text is
//     appended to the prompt.
//   - chat on vLLM and SGLang: a last message {"role": "assistant",
//     "content": <sent text>} with "continue_final_message": true (the
//     model continues that message, left open without an end-of-sequence
//     token) and "add_generation_prompt": false, which vLLM requires
//     beside it (vLLM's ChatCompletionRequest; SGLang takes the same).
//   - chat on llama.cpp: the same last message alone: llama-server
//     prefills a trailing assistant message unless started with
//     --no-prefill-assistant.
//
// Other kinds (TGI, TensorRT-LLM, Ollama, a generic OpenAI server) are not
// known to continue a message, so they are never chosen for a
// continuation (scheduler.Request.Kinds); where no worker can take it, the
// stream ends with the error event as without continuation.
//
// A stream is never continued when the client asked for n > 1 choices,
// once a tool call or reasoning text began (the assistant prefix would
// not say what the model was doing), when the key says continue: false,
// or when the request says X-Sluice-Continue: off.

// Continuation kinds of route, by path.
const (
	routeChat       = "chat"
	routeCompletion = "completions"
	routeNative     = "native"
)

// Engine kinds, as config and fleet name them.
const (
	kindLlamaCPP = "llamacpp"
	kindVLLM     = "vllm"
	kindSGLang   = "sglang"
)

// continuable are the routes that can be continued, and the worker kinds
// that can continue each.
var continuable = map[string]struct {
	route string
	kinds []string
}{
	"/v1/chat/completions": {routeChat, []string{kindLlamaCPP, kindVLLM, kindSGLang}},
	"/v1/completions":      {routeCompletion, []string{kindLlamaCPP, kindVLLM, kindSGLang}},
	"/completion":          {routeNative, []string{kindLlamaCPP}},
}

// continueHeader reads X-Sluice-Continue, which turns continuation off
// for one request: whether it does ("off"), or an error for any other
// value.
func continueHeader(h http.Header) (off bool, err error) {
	v := h.Values("X-Sluice-Continue")
	if len(v) == 0 {
		return false, nil
	}
	if len(v) != 1 || !strings.EqualFold(strings.TrimSpace(v[0]), "off") {
		return false, fmt.Errorf(`header X-Sluice-Continue: the only value is "off" (leave it out to allow continuation), got %q`, strings.Join(v, ", "))
	}
	return true, nil
}

// canContinue reports whether a streamed request on path may be continued
// at all, by its body: one choice, and a prompt or chat the engine can be
// asked to extend (a prompt string, or one string in an array; a chat
// whose last message is not already the assistant's).
func canContinue(path string, p parsed) (route string, kinds []string, ok bool) {
	c, known := continuable[path]
	if !known {
		return "", nil, false
	}
	if n := 1; isSet(p.choices) && (json.Unmarshal(p.choices, &n) != nil || n > 1) {
		return "", nil, false
	}
	switch c.route {
	case routeChat:
		if p.lastRole == "" || p.lastRole == "assistant" {
			return "", nil, false
		}
	default:
		if _, ok := promptString(p.prompt); !ok {
			return "", nil, false
		}
	}
	return c.route, c.kinds, true
}

// promptString returns a completion prompt that is one string (alone or
// the only element of an array), and whether it is.
func promptString(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var one []string
	if json.Unmarshal(raw, &one) == nil && len(one) == 1 {
		return one[0], true
	}
	return "", false
}

// continuationBody is the original body asking the worker of kind for
// the rest of an answer whose first part, sent, was emitted tokens: the
// sent text appended the route's way, and every positive token limit
// lowered by emitted. ok is false when a limit is used up (the answer had
// all its tokens and only its end is missing).
func continuationBody(body []byte, route, kind, sent string, emitted int) (out []byte, ok bool, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, false, err
	}
	for _, f := range []string{"max_tokens", "max_completion_tokens", "n_predict"} {
		raw, present := m[f]
		var n int
		if !present || json.Unmarshal(raw, &n) != nil || n <= 0 {
			continue // absent, or llama.cpp's -1: no limit
		}
		if n -= emitted; n <= 0 {
			return nil, false, nil
		}
		m[f] = json.RawMessage(fmt.Sprint(n))
	}
	switch route {
	case routeChat:
		var msgs []json.RawMessage
		if err := json.Unmarshal(m["messages"], &msgs); err != nil {
			return nil, false, err
		}
		last, _ := json.Marshal(map[string]string{"role": "assistant", "content": sent})
		m["messages"], _ = json.Marshal(append(msgs, last))
		if kind == kindVLLM || kind == kindSGLang {
			m["continue_final_message"] = json.RawMessage("true")
			m["add_generation_prompt"] = json.RawMessage("false")
		}
	default:
		p, ok := promptString(m["prompt"])
		if !ok {
			return nil, false, errors.New("the prompt is not one string")
		}
		m["prompt"], _ = json.Marshal(p + sent)
	}
	out, err = json.Marshal(m)
	return out, true, err
}
