package prefix

import (
	"encoding/json"
	"strings"
)

// PromptText returns the text FromFields cuts into blocks: the rendered
// messages (see Render), else a string prompt, else the prompt's JSON; ""
// when there is none or it cannot be read. So Text(PromptText(m, p), n)
// equals FromFields(m, p, n). The simulator reports it as the prompt its
// slots hold (llama.cpp's /slots "prompt"), so that the fleet's reading
// of a simulated worker's cache is in the router's blocks.
func PromptText(messages, prompt json.RawMessage) string {
	var msgs []Message
	if len(messages) > 0 && string(messages) != "null" && json.Unmarshal(messages, &msgs) != nil {
		return ""
	}
	var b strings.Builder
	switch {
	case len(msgs) > 0:
		Render(&b, msgs)
	case len(prompt) > 0 && prompt[0] == '"':
		var s string
		if json.Unmarshal(prompt, &s) != nil {
			return ""
		}
		b.WriteString(s)
	case len(prompt) > 0 && string(prompt) != "null":
		b.Write(prompt)
	}
	return b.String()
}
