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
		if _, ok := s.resolve(ws.Name); fw == nil || !ok {
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
		out, err := s.postTokenize(ctx, ws.Name, req)
		if err != nil {
			return 0, err
		}
		if out.Count != nil {
			return *out.Count, nil
		}
		return len(out.Tokens), nil
	}
	return 0, errors.New("no healthy llama.cpp or vLLM worker serves the model")
}

// tokenized is a worker's answer at POST /tokenize: llama.cpp's
// {"tokens"}, vLLM's {"count", "tokens", "max_model_len"}.
type tokenized struct {
	Count  *int     `json:"count"`
	Tokens []uint32 `json:"tokens"`
}

// postTokenize is the one client of the workers' POST /tokenize: it
// sends body to worker, with the worker's key, and reads the answer.
func (s *Server) postTokenize(ctx context.Context, worker string, body any) (tokenized, error) {
	base, ok := s.resolve(worker)
	if !ok {
		return tokenized{}, fmt.Errorf("worker %s has no address", worker)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return tokenized{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath("/tokenize").String(), bytes.NewReader(b))
	if err != nil {
		return tokenized{}, fmt.Errorf("tokenize on %s: %w", worker, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	// Counting tokens changes nothing: marked idempotent (the empty
	// header is not sent), the transport resends it by itself when a
	// pooled connection turns out closed by the worker.
	hr.Header["Idempotency-Key"] = nil
	if key, _ := s.credentials(worker); key != "" {
		hr.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := s.transport.RoundTrip(hr)
	if err != nil {
		return tokenized{}, fmt.Errorf("tokenize on %s: %w", worker, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return tokenized{}, fmt.Errorf("tokenize on %s: HTTP %d", worker, resp.StatusCode)
	}
	var out tokenized
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
		return tokenized{}, fmt.Errorf("tokenize on %s: %w", worker, err)
	}
	return out, nil
}
