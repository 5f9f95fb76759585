package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/sluice-router/sluice/internal/fleet"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// tokenize is the proxy's Tokenize hook: it counts text with the
// tokenizer of a healthy llama.cpp or vLLM worker serving model. Both
// serve POST /tokenize: llama.cpp takes {"content"} and answers
// {"tokens": [...]}, vLLM takes {"model", "prompt"} and answers
// {"count", "tokens", "max_model_len"}.
func (s *Server) tokenize(ctx context.Context, model, text string) (int, error) {
	for _, ws := range s.sched.Briefs() {
		if ws.Draining || ws.Health != scheduler.HealthOK || !slices.Contains(ws.Models, model) {
			continue
		}
		fw := s.fleet.Get(ws.Name)
		base, ok := s.resolve(ws.Name)
		if fw == nil || !ok {
			continue
		}
		var req any
		switch fw.Config().Kind {
		case fleet.KindLlamaCPP:
			req = map[string]any{"content": text, "add_special": true}
		case fleet.KindVLLM:
			req = map[string]any{"model": model, "prompt": text}
		default:
			continue
		}
		body, _ := json.Marshal(req)
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath("/tokenize").String(), bytes.NewReader(body))
		if err != nil {
			return 0, fmt.Errorf("tokenize on %s: %w", ws.Name, err)
		}
		hr.Header.Set("Content-Type", "application/json")
		// Counting tokens changes nothing: marked idempotent (the empty
		// header is not sent), the transport resends it by itself when a
		// pooled connection turns out closed by the worker.
		hr.Header["Idempotency-Key"] = nil
		if key, _ := s.credentials(ws.Name); key != "" {
			hr.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := s.transport.RoundTrip(hr)
		if err != nil {
			return 0, fmt.Errorf("tokenize on %s: %w", ws.Name, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("tokenize on %s: HTTP %d", ws.Name, resp.StatusCode)
		}
		var out struct {
			Count  *int              `json:"count"`
			Tokens []json.RawMessage `json:"tokens"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
			return 0, fmt.Errorf("tokenize on %s: %w", ws.Name, err)
		}
		if out.Count != nil {
			return *out.Count, nil
		}
		return len(out.Tokens), nil
	}
	return 0, errors.New("no healthy llama.cpp or vLLM worker serves the model")
}
