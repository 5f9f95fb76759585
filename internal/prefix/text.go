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
	var b strings.Builder
	if msgs, ok := decodeMessages(messages); !ok || !writePrompt(&b, msgs, prompt) {
		return ""
	}
	return b.String()
}
