package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/telemetry"
)

// LoRA adapters: what each worker holds, and loads on demand.
//
// vLLM lists the adapters it holds in /v1/models as models with a parent
// (the base model), read with the model list (scrapeModelCards).
// llama-server lists its --lora files in GET /lora-adapters, read with
// its model list; a file is named by the config's adapter of that path
// (WorkerConfig.AdapterPaths), else by its base name. A llama-server
// build without the endpoint answers 404, which is taken as no adapter.

// adaptersFromCards are the adapter entries of a vLLM model list.
func adaptersFromCards(cards []telemetry.ModelCard) []lora.Info {
	var out []lora.Info
	for _, c := range cards {
		if c.Parent != "" {
			out = append(out, lora.Info{Name: c.ID, Base: c.Parent, Source: "vllm /v1/models"})
		}
	}
	return out
}

// setAdapters publishes the adapters the worker reports, when they changed.
func (w *Worker) setAdapters(as []lora.Info) {
	w.mu.Lock()
	changed := w.setAdaptersLocked(as)
	if changed {
		w.publishLocked()
	}
	w.mu.Unlock()
	if changed {
		w.logAdapters(as)
	}
}

// setAdaptersLocked records the adapters the worker reports and says
// whether they changed; the caller publishes.
func (w *Worker) setAdaptersLocked(as []lora.Info) bool {
	if slices.Equal(w.st.adapters, as) {
		return false
	}
	w.st.adapters = slices.Clone(as)
	return true
}

// logAdapters logs a change of the worker's adapters and wakes the
// scheduler.
func (w *Worker) logAdapters(as []lora.Info) {
	names := make([]string, len(as))
	for i, a := range as {
		names[i] = a.Name
	}
	w.log.Info("worker LoRA adapters changed", slog.Any("adapters", names))
	w.notify()
}

// scrapeLoRA reads llama.cpp's GET /lora-adapters.
func (w *Worker) scrapeLoRA(ctx context.Context) {
	url := w.base + "/lora-adapters"
	status, body, err := w.get(ctx, url)
	if ctx.Err() != nil {
		return
	}
	var as []telemetry.LoRAAdapter
	switch {
	case err != nil:
	case status == http.StatusNotFound || status == http.StatusNotImplemented:
		w.setAdapters(nil) // a build without the endpoint: no adapter
		return
	case status != http.StatusOK:
		err = fmt.Errorf("scrape %s: HTTP %d: %s", url, status, snippet(body))
	default:
		if as, err = telemetry.ParseLlamaCPPLoRA(bytes.NewReader(body)); err != nil {
			err = fmt.Errorf("scrape %s: %w", url, err)
		}
	}
	w.setTelemetryErr(&w.st.loraErr, "lora-adapters", url, err)
	if err != nil {
		return
	}
	var out []lora.Info
	for _, a := range as {
		name, ok := w.cfg.AdapterPaths[a.Path]
		if !ok {
			name = a.Name()
		}
		out = append(out, lora.Info{Name: name, Source: fmt.Sprintf("llamacpp /lora-adapters id %d scale %g", a.ID, a.Scale)})
	}
	w.setAdapters(out)
}

// LoadAdapter loads a LoRA adapter on the worker through vLLM's POST
// /v1/load_lora_adapter {lora_name, lora_path} (served when vLLM runs
// with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). vLLM's answer that the
// adapter is loaded already is a success. On success the worker's
// snapshot lists the adapter at once, before the next scrape confirms it.
// already says the worker held it before (the snapshot was behind).
func (w *Worker) LoadAdapter(ctx context.Context, a lora.Spec) (already bool, err error) {
	if w.cfg.Kind != KindVLLM {
		return false, fmt.Errorf("worker %s: kind %s cannot load LoRA adapters at run time (vllm can)", w.cfg.Name, w.cfg.Kind)
	}
	url := w.base + "/v1/load_lora_adapter"
	body, _ := json.Marshal(map[string]string{"lora_name": a.Name, "lora_path": a.Path})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if w.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+w.cfg.APIKey)
	}
	start := time.Now()
	resp, err := w.opts.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	already = resp.StatusCode == http.StatusBadRequest && strings.Contains(string(msg), "has already been loaded")
	if resp.StatusCode != http.StatusOK && !already {
		return false, fmt.Errorf("POST %s: HTTP %d: %s", url, resp.StatusCode, snippet(msg))
	}
	w.mu.Lock()
	loaded := lora.Info{Name: a.Name, Base: a.Base, Source: "loaded by Sluice"}
	if w.st.loadedAt == nil {
		w.st.loadedAt = map[string]loadedAdapter{}
	}
	w.st.loadedAt[a.Name] = loadedAdapter{info: loaded, at: time.Now()}
	if !slices.ContainsFunc(w.st.adapters, func(x lora.Info) bool { return x.Name == a.Name }) {
		w.st.adapters = append(slices.Clip(w.st.adapters), loaded)
	}
	if w.st.Models != nil && !slices.Contains(w.st.Models, a.Name) {
		w.st.Models = append(slices.Clip(w.st.Models), a.Name)
	}
	w.publishLocked()
	w.mu.Unlock()
	w.log.Info("loaded LoRA adapter", slog.String("adapter", a.Name), slog.String("path", a.Path), slog.Duration("took", time.Since(start)))
	w.notify()
	return already, nil
}

// loadedAdapter is an adapter Sluice loaded on the worker, and when the
// load was answered.
type loadedAdapter struct {
	info lora.Info
	at   time.Time
}

// withRecentLoads adds to a model list scraped from started on the
// adapters Sluice loaded after started: the list was read before the
// worker held them, and publishing it as is would make the worker drop
// an adapter it holds until the next scrape — long enough for the
// scheduler to load it on another worker beyond max_replicas. A list
// read after a load is the worker's word: the load is forgotten, and an
// adapter the list lacks then (the worker restarted) is not held.
func (w *Worker) withRecentLoads(started time.Time, ids []string, adapters []lora.Info) ([]string, []lora.Info) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, l := range w.st.loadedAt {
		if !l.at.After(started) {
			delete(w.st.loadedAt, name)
			continue
		}
		if !slices.Contains(ids, name) {
			ids = append(ids, name)
		}
		if !slices.ContainsFunc(adapters, func(x lora.Info) bool { return x.Name == name }) {
			adapters = append(adapters, l.info)
		}
	}
	return ids, adapters
}
