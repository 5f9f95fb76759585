// Package prefixtest helps tests of packages that hash prompts: it reads
// a whole request body as the proxy's one decode of it would.
package prefixtest

import (
	"encoding/json"

	"github.com/sluice-router/sluice/internal/prefix"
)

// FromBody returns the chained block hashes (blocks of blockBytes bytes)
// of an OpenAI-style inference request body: the rendered `messages` of a
// chat request, else its `prompt`. A body it cannot read has none.
func FromBody(b []byte, blockBytes int) []uint64 {
	var in struct {
		Messages []prefix.Message `json:"messages"`
		Prompt   json.RawMessage  `json:"prompt"`
	}
	if json.Unmarshal(b, &in) != nil {
		return nil
	}
	return prefix.FromMessages(in.Messages, in.Prompt, blockBytes)
}
