package telemetry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
)

// ServerState is what a health endpoint says about a server.
type ServerState int

const (
	// StateUnknown means the answer could not be read.
	StateUnknown ServerState = iota
	// StateReady means the server is up with its model loaded.
	StateReady
	// StateLoading means the server is up but still loading its model;
	// it cannot take requests yet.
	StateLoading
	// StateError means the server answered that it is broken (a failed
	// model load, a dead engine, or an unexpected status).
	StateError
)

// String returns the state as a lower-case word.
func (s ServerState) String() string {
	switch s {
	case StateReady:
		return "ready"
	case StateLoading:
		return "loading"
	case StateError:
		return "error"
	default:
		return "unknown"
	}
}

// HealthResult is a parsed health answer.
type HealthResult struct {
	// State is the server's state.
	State ServerState `json:"state"`
	// Message is the server's own words, e.g. "Loading model", or a
	// description of the status when the body says nothing.
	Message string `json:"message,omitempty"`
}

// llamaHealthBody covers both answers of llama.cpp's GET /health:
// {"status":"ok"} (older builds add slots_idle and slots_processing, and
// say "no slot available" when all slots are busy), and the error object
// {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}
// (500 "Model failed to load" in older builds).
type llamaHealthBody struct {
	Status string `json:"status"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

// ParseLlamaCPPHealth reads llama.cpp's GET /health answer: 200 is ready
// (also when the body says "no slot available": the server is up, just
// busy), 503 is loading, anything else is an error. A body that is not
// JSON on a 200 is an error wrapping ErrMalformed, with StateUnknown.
func ParseLlamaCPPHealth(status int, body io.Reader) (HealthResult, error) {
	raw, err := io.ReadAll(body)
	if err != nil {
		return HealthResult{}, fmt.Errorf("parse llama.cpp health: read body: %w", err)
	}
	var b llamaHealthBody
	jsonErr := json.Unmarshal(raw, &b)
	msg := ""
	if jsonErr == nil && b.Error != nil {
		msg = b.Error.Message
	}
	switch {
	case status == http.StatusOK:
		if jsonErr != nil {
			return HealthResult{}, fmt.Errorf("parse llama.cpp health: %w", malformed("json", jsonErr))
		}
		return HealthResult{State: StateReady, Message: b.Status}, nil
	case status == http.StatusServiceUnavailable:
		if msg == "" {
			msg = "loading model"
		}
		return HealthResult{State: StateLoading, Message: msg}, nil
	default:
		if msg == "" {
			msg = fmt.Sprintf("HTTP %d", status)
		}
		return HealthResult{State: StateError, Message: msg}, nil
	}
}

// ParseHealthStatus reads a health endpoint that answers with its status
// alone (vLLM's, SGLang's and trtllm-serve's GET /health): 200 is ready;
// anything else (vLLM's 503 once the engine is dead) is an error. These
// servers only listen once their model is loaded, so there is no loading
// answer.
func ParseHealthStatus(status int) HealthResult {
	if status == http.StatusOK {
		return HealthResult{State: StateReady}
	}
	return HealthResult{State: StateError, Message: fmt.Sprintf("HTTP %d", status)}
}

// Props is what llama.cpp's GET /props says that Sluice uses.
type Props struct {
	// TotalSlots is the number of parallel slots (--parallel); 0 when
	// absent.
	TotalSlots int `json:"total_slots"`
	// NCtx is the context size of one slot, from
	// default_generation_settings.n_ctx; 0 when absent.
	NCtx int `json:"n_ctx,omitempty"`
	// BOSToken is the text of the model's beginning-of-sequence token
	// (bos_token), which starts every prompt /slots reports; empty when
	// absent.
	BOSToken string `json:"bos_token,omitempty"`
}

// ParseLlamaCPPProps reads llama.cpp's GET /props. A missing or
// non-positive total_slots returns the rest of Props and a *MissingError.
func ParseLlamaCPPProps(r io.Reader) (Props, error) {
	var p struct {
		TotalSlots *int   `json:"total_slots"`
		BOSToken   string `json:"bos_token"`
		Defaults   struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := decodeJSON(r, &p); err != nil {
		return Props{}, fmt.Errorf("parse llama.cpp props: %w", err)
	}
	out := Props{NCtx: max(p.Defaults.NCtx, 0), BOSToken: p.BOSToken}
	if p.TotalSlots == nil || *p.TotalSlots <= 0 {
		return out, fmt.Errorf("parse llama.cpp props: %w", &MissingError{Metrics: []string{"total_slots"}})
	}
	out.TotalSlots = *p.TotalSlots
	return out, nil
}

// openAIModels is the OpenAI list of models, with llama.cpp's additions:
// the Ollama-style "models" array next to "data", and in router mode a
// status per model.
type openAIModels struct {
	Object string `json:"object"`
	Data   *[]struct {
		ID     string `json:"id"`
		Status *struct {
			Value string `json:"value"`
		} `json:"status"`
	} `json:"data"`
	Models *[]struct {
		Name  string `json:"name"`
		Model string `json:"model"`
	} `json:"models"`
}

// ErrNoModelList means a /v1/models body had neither "data" nor "models".
var ErrNoModelList = errors.New(`no "data" list of models`)

// ParseOpenAIModels reads an OpenAI GET /v1/models list and returns
// data[].id in order, without duplicates or empty ids. An empty list is
// a non-nil empty slice: the server has no model, which is a fact.
// This is the parser for any OpenAI-compatible server.
func ParseOpenAIModels(r io.Reader) ([]string, error) {
	var l openAIModels
	if err := decodeJSON(r, &l); err != nil {
		return nil, fmt.Errorf("parse models: %w", err)
	}
	if l.Data == nil {
		return nil, fmt.Errorf("parse models: %w", ErrNoModelList)
	}
	ids := []string{}
	for _, d := range *l.Data {
		ids = appendUnique(ids, d.ID)
	}
	return ids, nil
}

// ParseLlamaCPPModels reads llama.cpp's GET /v1/models. It takes data[].id
// and, when "data" is absent, the Ollama-style models[].model (or .name)
// that llama.cpp also sends. In router mode each entry has a status:
// only "loaded" and "sleeping" models (sleeping wakes on the next
// request) count; "loading", "unloaded" and "failed" ones do not. An
// entry without status is loaded.
func ParseLlamaCPPModels(r io.Reader) ([]string, error) {
	var l openAIModels
	if err := decodeJSON(r, &l); err != nil {
		return nil, fmt.Errorf("parse llama.cpp models: %w", err)
	}
	ids := []string{}
	switch {
	case l.Data != nil:
		for _, d := range *l.Data {
			if d.Status != nil && d.Status.Value != "loaded" && d.Status.Value != "sleeping" {
				continue
			}
			ids = appendUnique(ids, d.ID)
		}
	case l.Models != nil:
		for _, m := range *l.Models {
			id := m.Model
			if id == "" {
				id = m.Name
			}
			ids = appendUnique(ids, id)
		}
	default:
		return nil, fmt.Errorf("parse llama.cpp models: %w", ErrNoModelList)
	}
	return ids, nil
}

func appendUnique(ids []string, id string) []string {
	if id == "" || slices.Contains(ids, id) {
		return ids
	}
	return append(ids, id)
}

// decodeJSON decodes one JSON object from r, wrapping failures in
// ErrMalformed; trailing non-space data is an error too.
func decodeJSON(r io.Reader, v any) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return malformed("json", errors.New("empty body"))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return malformed("json", err)
	}
	return nil
}
