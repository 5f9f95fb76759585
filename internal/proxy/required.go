package proxy

import (
	"encoding/json"
	"fmt"
)

// What a chat completion, a completion and a Messages request must hold
// beside their model, as the APIs define them: a chat request a non-empty
// array of messages, each an object with a string role; a completion a
// prompt. Sluice reads these bodies anyway, so it refuses such a request
// itself, naming the field, rather than pass it to a worker that answers
// in its own words (a Go type name, a Python validation dump).

// msgFault is what is wrong with a request's messages, if anything.
type msgFault struct {
	kind  faultKind
	index int    // the message at fault (faultNotObject, faultNoRole, faultBadRole)
	got   string // what was there instead, in words: "a string", "an empty string"
}

type faultKind int

const (
	noFault        faultKind = iota
	faultMissing             // absent or null
	faultNotArray            // not an array
	faultEmpty               // an empty array
	faultNotObject           // a message that is not an object
	faultNoRole              // a message without a role (or a null one)
	faultBadRole             // a role that is not a string, or is empty
)

// checkMessages returns the first fault of raw, a body's messages as sent
// (valid JSON, or empty when absent). It decodes raw again, so the request
// path calls it only when the one decode of the body found something
// amiss.
func checkMessages(raw json.RawMessage) msgFault {
	switch t := firstByte(raw); t {
	case 0, 'n':
		return msgFault{kind: faultMissing}
	case '[':
	default:
		return msgFault{kind: faultNotArray, got: jsonKind(t)}
	}
	var msgs []json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil {
		return msgFault{} // not reached: raw is valid JSON
	}
	if len(msgs) == 0 {
		return msgFault{kind: faultEmpty}
	}
	for i, m := range msgs {
		if t := firstByte(m); t != '{' {
			return msgFault{kind: faultNotObject, index: i, got: jsonKind(t)}
		}
		// Keys match as the body's decode matches them (any case).
		var f struct {
			Role json.RawMessage `json:"role"`
		}
		if json.Unmarshal(m, &f) != nil {
			return msgFault{} // not reached: m is a valid object
		}
		switch t := firstByte(f.Role); {
		case t == 0 || t == 'n':
			return msgFault{kind: faultNoRole, index: i}
		case t != '"':
			return msgFault{kind: faultBadRole, index: i, got: jsonKind(t)}
		case jsonString(f.Role) == "":
			return msgFault{kind: faultBadRole, index: i, got: "an empty string"}
		}
	}
	return msgFault{}
}

// openAI is the fault as OpenAI's API states it: param names the field,
// down to the message (messages[1].role). nil for no fault.
func (f msgFault) openAI() error {
	const want = `an array of messages, each an object with a "role"`
	const role = `a string such as "user" or "assistant"`
	at := fmt.Sprintf("messages[%d]", f.index)
	switch f.kind {
	case faultMissing:
		return &badRequest{"messages", `missing required field "messages" (` + want + `)`}
	case faultNotArray:
		return &badRequest{"messages", fmt.Sprintf(`"messages" must be %s, got %s`, want, f.got)}
	case faultEmpty:
		return &badRequest{"messages", `"messages" must hold at least one message, got an empty array`}
	case faultNotObject:
		return &badRequest{at, fmt.Sprintf(`%q must be a message object with a "role", got %s`, at, f.got)}
	case faultNoRole:
		return &badRequest{at + ".role", fmt.Sprintf(`missing required field "%s.role" (%s)`, at, role)}
	case faultBadRole:
		return &badRequest{at + ".role", fmt.Sprintf(`"%s.role" must be %s, got %s`, at, role, f.got)}
	}
	return nil
}

// anthropic is the fault as Anthropic's API states it: the field's path in
// the message (messages.1.role), param "messages". nil for no fault.
func (f msgFault) anthropic() error {
	switch f.kind {
	case faultMissing:
		return &badRequest{"messages", `messages: Field required (an array of messages)`}
	case faultNotArray:
		return &badRequest{"messages", "messages: must be an array of messages, got " + f.got}
	case faultEmpty:
		return &badRequest{"messages", "messages: at least one message is required"}
	case faultNotObject:
		return &badRequest{"messages", fmt.Sprintf(`messages.%d: must be a message object with "role" and "content", got %s`, f.index, f.got)}
	case faultNoRole:
		return &badRequest{"messages", fmt.Sprintf(`messages.%d.role: Field required ("user" or "assistant")`, f.index)}
	case faultBadRole:
		return &badRequest{"messages", fmt.Sprintf(`messages.%d.role: must be "user" or "assistant", got %s`, f.index, f.got)}
	}
	return nil
}

// requireMessages is a chat completion's check: its messages as the body's
// decode read them are looked at again only when they seem wrong.
func requireMessages(in *inference) error {
	if !in.Messages.bad && len(in.Messages.msgs) > 0 {
		ok := true
		for _, m := range in.Messages.msgs {
			ok = ok && m.Role != ""
		}
		if ok {
			return nil
		}
	}
	// A fault seen in a key the body repeats may not be in its last
	// value, which is what a worker reads: then there is none to report.
	return checkMessages(in.Messages.raw).openAI()
}

// requirePrompt is a completion's check: a prompt that is a string or an
// array (of strings, of token ids, of arrays of them), or an object
// (llama.cpp's multimodal prompt). vLLM's prompt_embeds may stand in for
// it.
func requirePrompt(in *inference) error {
	const want = "a string, an array of strings, or token ids"
	switch t := firstByte(in.Prompt); t {
	case '"', '[', '{':
		return nil
	case 0, 'n':
		if in.PromptEmbeds {
			return nil
		}
		return &badRequest{"prompt", `missing required field "prompt" (` + want + `)`}
	default:
		return &badRequest{"prompt", fmt.Sprintf(`"prompt" must be %s, got %s`, want, jsonKind(t))}
	}
}

// present records whether a body holds a field (not null), without
// keeping its value.
type present bool

func (p *present) UnmarshalJSON(b []byte) error {
	*p = string(b) != "null"
	return nil
}
