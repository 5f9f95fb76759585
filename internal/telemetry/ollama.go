package telemetry

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// OllamaModel is one entry of Ollama's GET /api/ps: a model loaded in
// memory.
type OllamaModel struct {
	// Name is the model's name as clients ask for it, e.g. "mistral:latest".
	Name string `json:"name"`
	// ContextLength is the context the model was loaded with (newer
	// builds); 0 when absent.
	ContextLength int `json:"context_length,omitempty"`
}

// ErrNoOllamaModels means an /api/ps body had no "models" list.
var ErrNoOllamaModels = errors.New(`no "models" list`)

// ParseOllamaPS reads Ollama's GET /api/ps (docs/api.md, "List Running
// Models"): {"models":[{"name","model","size","size_vram","expires_at",
// "context_length",...}]}. It returns the loaded models in order, without
// duplicates or unnamed entries (the name falls back to "model"). An
// empty list is a non-nil empty slice: nothing is loaded, which is a fact.
func ParseOllamaPS(r io.Reader) ([]OllamaModel, error) {
	var b struct {
		Models *[]struct {
			Name          string `json:"name"`
			Model         string `json:"model"`
			ContextLength int    `json:"context_length"`
		} `json:"models"`
	}
	if err := decodeJSON(r, &b); err != nil {
		return nil, fmt.Errorf("parse ollama ps: %w", err)
	}
	if b.Models == nil {
		return nil, fmt.Errorf("parse ollama ps: %w", ErrNoOllamaModels)
	}
	out := []OllamaModel{}
	seen := map[string]bool{}
	for _, m := range *b.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, OllamaModel{Name: name, ContextLength: max(m.ContextLength, 0)})
	}
	return out, nil
}

// ollamaRunning is what Ollama's GET / answers when it is up.
const ollamaRunning = "Ollama is running"

// ParseOllamaRoot reads Ollama's GET /: 200 with the text "Ollama is
// running" is ready. A 200 saying something else is another server on
// the port and an error wrapping ErrMalformed with StateUnknown; any
// other status is an error state.
func ParseOllamaRoot(status int, body io.Reader) (HealthResult, error) {
	raw, err := io.ReadAll(io.LimitReader(body, 64<<10))
	if err != nil {
		return HealthResult{}, fmt.Errorf("parse ollama root: read body: %w", err)
	}
	if status != http.StatusOK {
		return HealthResult{State: StateError, Message: fmt.Sprintf("HTTP %d", status)}, nil
	}
	text := strings.TrimSpace(string(raw))
	if text != ollamaRunning {
		return HealthResult{}, fmt.Errorf("parse ollama root: %w", malformed("answer", fmt.Errorf("%q is not %q", clip(text, 60), ollamaRunning)))
	}
	return HealthResult{State: StateReady, Message: text}, nil
}

// clip shortens s to at most n bytes for error messages.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
