package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// tokenized is a worker's answer at POST /tokenize: llama.cpp's
// {"tokens"}, vLLM's {"count", "tokens", "max_model_len"}: the
// token ids are what is read.
type tokenized struct {
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
