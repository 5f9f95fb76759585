package prefix

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestPromptText_IsWhatFromFieldsHashes(t *testing.T) {
	long := strings.Repeat("All work and no play. ", 60)
	tests := []struct {
		name             string
		messages, prompt string
	}{
		{"chat", `[{"role":"system","content":` + quote(long) + `},{"role":"user","content":"hi"}]`, ""},
		{"chat with parts", `[{"role":"user","content":[{"type":"text","text":` + quote(long) + `},{"type":"image_url","image_url":{"url":"data:x"}}]}]`, ""},
		{"raw prompt", "", quote(long)},
		{"token ids", "", "[" + strings.Repeat("15043,", 300) + "1]"},
		{"nothing", "", ""},
		{"unreadable messages", `[{"role":1}]`, quote(long)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, p := json.RawMessage(tt.messages), json.RawMessage(tt.prompt)
			text := PromptText(m, p)
			got, want := Text(text, BlockBytes), FromFields(m, p, BlockBytes)
			if len(got) == 0 {
				got = nil
			}
			if !slices.Equal(got, want) {
				t.Errorf("Text(PromptText) = %v, FromFields = %v (text %d bytes)", got, want, len(text))
			}
		})
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
