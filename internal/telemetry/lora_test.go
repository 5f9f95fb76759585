package telemetry

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLlamaCPPLoRA(t *testing.T) {
	tests := []struct {
		name    string
		body    string // empty: the golden file
		want    []LoRAAdapter
		errKind string
	}{
		{name: "golden", want: []LoRAAdapter{
			{ID: 0, Path: "/adapters/sql-lora.gguf", Scale: 1},
			{ID: 1, Path: "/adapters/chat-lora.gguf", Scale: 0},
		}},
		{name: "none", body: `[]`, want: []LoRAAdapter{}},
		{name: "scale absent is 1", body: `[{"id":3,"path":"a.gguf"}]`, want: []LoRAAdapter{{ID: 3, Path: "a.gguf", Scale: 1}}},
		{name: "no path", body: `[{"id":0,"scale":1}]`, errKind: "malformed"},
		{name: "not an array", body: `{"id":0}`, errKind: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []LoRAAdapter
			var err error
			if tt.body == "" {
				got, err = ParseLlamaCPPLoRA(open(t, "llamacpp_lora_adapters.json"))
			} else {
				got, err = ParseLlamaCPPLoRA(strings.NewReader(tt.body))
			}
			checkErr(t, err, tt.errKind)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoRAAdapter_Name(t *testing.T) {
	for path, want := range map[string]string{
		"/adapters/sql-lora.gguf": "sql-lora",
		"chat.gguf":               "chat",
		`C:\loras\x.y.gguf`:       "x.y",
		"plain":                   "plain",
	} {
		if got := (LoRAAdapter{Path: path}).Name(); got != want {
			t.Errorf("Name of %q = %q, want %q", path, got, want)
		}
	}
}
