package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
)

// LoRA makes a simulated worker serve LoRA adapters over its model the
// way vLLM does with --enable-lora: /v1/models lists each loaded adapter
// as a model whose parent is the base model; POST /v1/load_lora_adapter
// {lora_name, lora_path} loads one at run time (vLLM serves it only with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: RuntimeLoading); and a request
// whose model is neither the base model nor a loaded adapter is refused
// with vLLM's 404 NotFoundError. An adapter costs nothing extra to run:
// the engine's model of time is the base model's.
type LoRA struct {
	// Adapters are loaded from the start (vLLM's --lora-modules), by
	// name; their paths are /adapters/<name>.
	Adapters []string `json:"adapters,omitempty"`
	// RuntimeLoading serves POST /v1/load_lora_adapter.
	RuntimeLoading bool `json:"runtime_loading,omitempty"`
}

// loraState is a Server's adapters; nil-safe when LoRA is off.
type loraState struct {
	on      bool
	runtime bool
	mu      sync.Mutex
	names   []string          // in load order, as vLLM lists them
	paths   map[string]string // by name
	loads   int               // loads made through the endpoint
}

func newLoRAState(l *LoRA) *loraState {
	st := &loraState{paths: map[string]string{}}
	if l == nil {
		return st
	}
	st.on, st.runtime = true, l.RuntimeLoading
	for _, n := range l.Adapters {
		if _, dup := st.paths[n]; !dup {
			st.names = append(st.names, n)
			st.paths[n] = "/adapters/" + n
		}
	}
	return st
}

// LoRAAdapters returns the adapters the worker holds, in load order, and
// how many were loaded through /v1/load_lora_adapter.
func (s *Server) LoRAAdapters() ([]string, int) {
	s.lora.mu.Lock()
	defer s.lora.mu.Unlock()
	return slices.Clone(s.lora.names), s.lora.loads
}

func (s *Server) loraRoutes(m *http.ServeMux) {
	if s.lora.on && s.lora.runtime {
		m.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
	}
}

// loraCards are the adapters' entries of /v1/models, as vLLM's
// show_available_models writes them.
func (s *Server) loraCards() []any {
	if !s.lora.on {
		return nil
	}
	s.lora.mu.Lock()
	defer s.lora.mu.Unlock()
	out := make([]any, 0, len(s.lora.names))
	for _, n := range s.lora.names {
		out = append(out, map[string]any{
			"id": n, "object": "model", "created": s.realStart.Unix(), "owned_by": "vllm",
			"root": s.lora.paths[n], "parent": s.p.Model, "max_model_len": nil, "permission": []any{},
		})
	}
	return out
}

// loraServes refuses, with vLLM's 404, a request for a model that is
// neither the base model nor a loaded adapter, and reports whether the
// request may go on. Without LoRA any model is served, as llama-server
// serves its one model whatever the request names.
func (s *Server) loraServes(w http.ResponseWriter, model string) bool {
	if !s.lora.on || model == "" || model == s.p.Model {
		return true
	}
	s.lora.mu.Lock()
	_, ok := s.lora.paths[model]
	s.lora.mu.Unlock()
	if !ok {
		writeVLLMError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model))
	}
	return ok
}

// writeVLLMError writes vLLM's ErrorResponse in its {"error": {...}}
// envelope (testdata vllm_error_model_not_found.json in telemetry).
func writeVLLMError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

// handleLoadLoRA is vLLM's POST /v1/load_lora_adapter: both fields are
// required, an adapter loaded already is a 400, success a plain-text 200.
func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
		writeVLLMError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	if req.Name == "" || req.Path == "" {
		writeVLLMError(w, http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	s.lora.mu.Lock()
	if _, ok := s.lora.paths[req.Name]; ok {
		s.lora.mu.Unlock()
		writeVLLMError(w, http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.Name))
		return
	}
	s.lora.names = append(s.lora.names, req.Name)
	s.lora.paths[req.Name] = req.Path
	s.lora.loads++
	s.lora.mu.Unlock()
	s.log.Info("loaded LoRA adapter", "name", req.Name, "path", req.Path)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}
