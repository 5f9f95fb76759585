package telemetry

import (
	"fmt"
	"io"
	"path"
	"strings"
)

// LoRAAdapter is one LoRA adapter a worker holds, as llama.cpp's GET
// /lora-adapters lists it. llama-server loads its adapters at start
// (--lora FILE, --lora-scaled FILE SCALE) and numbers them; a request
// applies them through its own "lora" field, else at the global scale.
type LoRAAdapter struct {
	// ID is the adapter's index on the server.
	ID int `json:"id"`
	// Path is the adapter file the server was started with.
	Path string `json:"path"`
	// Scale is its global scale; 0 means loaded but applied only by a
	// request that asks for it.
	Scale float64 `json:"scale"`
}

// Name is the adapter's name when the config gives it none: the file's
// base name without its extension ("/adapters/sql-lora.gguf" is
// "sql-lora").
func (a LoRAAdapter) Name() string {
	b := path.Base(strings.ReplaceAll(a.Path, "\\", "/"))
	return strings.TrimSuffix(b, path.Ext(b))
}

// ParseLlamaCPPLoRA reads llama.cpp's GET /lora-adapters: a JSON array of
// {id, path, scale}. An empty array is an empty, non-nil slice (no
// adapter is a fact); an entry without a path is an error naming it.
func ParseLlamaCPPLoRA(r io.Reader) ([]LoRAAdapter, error) {
	var raw []struct {
		ID    *int     `json:"id"`
		Path  string   `json:"path"`
		Scale *float64 `json:"scale"`
	}
	if err := decodeJSON(r, &raw); err != nil {
		return nil, fmt.Errorf("parse lora-adapters: %w", err)
	}
	out := make([]LoRAAdapter, 0, len(raw))
	for i, a := range raw {
		if a.ID == nil || a.Path == "" {
			return nil, fmt.Errorf("parse lora-adapters: entry %d: %w", i, malformed("json", fmt.Errorf("want id and path, got id %v path %q", a.ID, a.Path)))
		}
		la := LoRAAdapter{ID: *a.ID, Path: a.Path, Scale: 1}
		if a.Scale != nil {
			la.Scale = *a.Scale
		}
		out = append(out, la)
	}
	return out, nil
}
