package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/telemetry"
)

// maxBody caps what a probe reads; /props carries the chat template, a
// dcgm-exporter with many GPUs and fields a few hundred KiB.
const maxBody = 8 << 20

// get fetches url with the probe timeout and returns status and body.
func (w *Worker) get(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if w.cfg.APIKey != "" && underBase(url, w.cfg.URL) {
		req.Header.Set("Authorization", "Bearer "+w.cfg.APIKey)
	}
	resp, err := w.opts.Client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("scrape %s: read body: %w", url, err)
	}
	return resp.StatusCode, body, nil
}

// underBase reports whether url is base or a path below it, so a
// worker's key goes to the worker's own server only.
func underBase(url, base string) bool {
	base = strings.TrimRight(base, "/")
	return url == base || strings.HasPrefix(url, base+"/") || strings.HasPrefix(url, base+"?")
}

// fetch GETs url and parses a 200 answer with parse; any other status is
// an error, and every error names url.
func fetch[T any](ctx context.Context, w *Worker, url string, parse func(io.Reader) (T, error)) (T, error) {
	var v T
	status, body, err := w.get(ctx, url)
	switch {
	case err != nil:
	case status != http.StatusOK:
		err = fmt.Errorf("scrape %s: HTTP %d: %s", url, status, snippet(body))
	default:
		if v, err = parse(bytes.NewReader(body)); err != nil {
			err = fmt.Errorf("scrape %s: %w", url, err)
		}
	}
	return v, err
}

// snippet is the start of a body, for error messages.
func snippet(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 120 {
		return string(b[:120]) + "..."
	}
	return string(b)
}

// scrape runs one probe round for the worker's kind.
func (w *Worker) scrape(ctx context.Context) {
	now := w.opts.Now()
	w.mu.Lock()
	w.st.LastScrape = now
	wasOK := w.st.Health == snapshot.HealthOK
	w.mu.Unlock()

	var err error
	switch w.cfg.Kind {
	case KindLlamaCPP:
		err = w.scrapeLlamaCPP(ctx, now, wasOK)
	case KindVLLM:
		err = w.scrapeModelServer(ctx, now, wasOK, w.forModel(telemetry.ParseVLLM))
	case KindOpenAI:
		err = w.scrapeOpenAI(ctx, now)
	case KindSGLang:
		err = w.scrapeModelServer(ctx, now, wasOK, w.forModel(telemetry.ParseSGLang))
	case KindTGI:
		err = w.scrapeTGI(ctx, now, wasOK)
	case KindTRTLLM:
		err = w.scrapeModelServer(ctx, now, wasOK, telemetry.ParseTRTLLMStats)
	case KindOllama:
		err = w.scrapeOllama(ctx, now)
	}
	if ctx.Err() != nil {
		return // stopping: the failure is ours, not the worker's
	}
	w.mu.Lock()
	w.st.LastError = ""
	if err != nil {
		w.st.LastError = err.Error()
	}
	w.mu.Unlock()
}

// probeHealth fetches path, records the outcome parse makes of it and
// returns the server's state; a cancelled ctx returns StateUnknown and
// records nothing.
func (w *Worker) probeHealth(ctx context.Context, path string, parse func(int, io.Reader) (telemetry.HealthResult, error)) (telemetry.ServerState, error) {
	url := w.base + path
	status, body, err := w.get(ctx, url)
	if err == nil {
		var h telemetry.HealthResult
		h, err = parse(status, bytes.NewReader(body))
		if err == nil {
			switch h.State {
			case telemetry.StateReady:
				w.observe(outcome{kind: outcomePass})
				return h.State, nil
			case telemetry.StateLoading:
				w.observe(outcome{kind: outcomeLoading, reason: "loading: " + h.Message})
				return h.State, nil
			default:
				err = fmt.Errorf("scrape %s: %s", url, h.Message)
			}
		} else {
			err = fmt.Errorf("scrape %s: %w", url, err)
		}
	}
	if ctx.Err() != nil {
		return telemetry.StateUnknown, err
	}
	w.observe(outcome{kind: outcomeFail, reason: err.Error()})
	return telemetry.StateError, err
}

func (w *Worker) scrapeLlamaCPP(ctx context.Context, now time.Time, wasOK bool) error {
	state, err := w.probeHealth(ctx, "/health", telemetry.ParseLlamaCPPHealth)
	if state != telemetry.StateReady {
		return err
	}
	w.scrapeMetrics(ctx, now, "/metrics", telemetry.ParseLlamaCPP)
	w.scrapeSlots(ctx, now)
	if !wasOK || w.due(now, w.st.propsAt) {
		w.scrapeProps(ctx, now)
	}
	if !wasOK || w.due(now, w.st.modelsAt) {
		w.scrapeModels(ctx, now)
		w.scrapeLoRA(ctx)
	}
	w.scrapeGPU(ctx, now)
	return nil
}

// scrapeOpenAI probes /v1/models: its answer is both health and models.
func (w *Worker) scrapeOpenAI(ctx context.Context, now time.Time) error {
	models, err := fetch(ctx, w, w.base+"/v1/models", telemetry.ParseOpenAIModels)
	if ctx.Err() != nil {
		return err
	}
	if err != nil {
		w.observe(outcome{kind: outcomeFail, reason: err.Error()})
		return err
	}
	w.observe(outcome{kind: outcomePass})
	w.setModels(now, models)
	w.scrapeGPU(ctx, now)
	return nil
}

// due reports whether a refresh last done at last is due; reads w.st
// fields only written by the scraper itself, under the round lock.
func (w *Worker) due(now, last time.Time) bool {
	return last.IsZero() || now.Sub(last) >= w.opts.ModelRefresh
}

// scrapeMetrics reads a /metrics and updates the readings it carries.
// Absent or unreadable metrics leave the old readings (and their times).
func (w *Worker) scrapeMetrics(ctx context.Context, now time.Time, path string, parse func(io.Reader) (telemetry.Metrics, error)) {
	url := w.base + path
	m, err := fetch(ctx, w, url, parse)
	if ctx.Err() != nil {
		return
	}
	src := w.cfg.Kind + " " + path + " "
	w.mu.Lock()
	update(&w.st.QueueLen, m.QueueLen, src, now)
	update(&w.st.Running, m.Running, src, now)
	update(&w.st.KVPressure, m.KVUsage, src, now)
	if m.KVUsedTokens.Present && m.KVUsage.Present && m.KVUsage.V > 0 {
		w.st.kvCells = m.KVUsedTokens.V / m.KVUsage.V
	}
	w.updatePrefixCacheLocked(m.PrefixCache, src, now)
	w.publishLocked()
	w.mu.Unlock()
	w.setTelemetryErr(&w.st.MetricsError, "metrics", url, err)
}

// update replaces r with v when v is present.
func update(r *snapshot.Reading, v telemetry.Value, src string, now time.Time) {
	if v.Present {
		*r = snapshot.Reading{Value: v.V, Source: src + v.Metric, At: now}
	}
}

// scrapeProps reads llama.cpp's /props: the slot count, the BOS text and,
// while /slots is off, the context size.
func (w *Worker) scrapeProps(ctx context.Context, now time.Time) {
	url := w.base + "/props"
	p, err := fetch(ctx, w, url, telemetry.ParseLlamaCPPProps)
	if ctx.Err() != nil {
		return
	}
	changed := false
	w.mu.Lock()
	w.st.propsAt = now
	if err == nil {
		changed = p.TotalSlots != w.st.Slots
		w.st.Slots, w.st.bos = p.TotalSlots, p.BOSToken
		if changed {
			w.publishLocked()
		}
		if p.NCtx > 0 && w.st.SlotsError != "" {
			// /slots is off (--no-slots): the defaults' n_ctx stands in.
			w.setContextLocked(p.NCtx)
		}
	}
	w.mu.Unlock()
	w.setTelemetryErr(&w.st.PropsError, "props", url, err)
	if changed {
		w.log.Info("worker slots changed", slog.Int(keySlots, p.TotalSlots))
		w.notify()
	}
}

// scrapeModels reads llama.cpp's /v1/models and publishes the list when
// it changed.
func (w *Worker) scrapeModels(ctx context.Context, now time.Time) {
	url := w.base + "/v1/models"
	models, err := fetch(ctx, w, url, telemetry.ParseLlamaCPPModels)
	if ctx.Err() != nil {
		return
	}
	w.setTelemetryErr(&w.st.ModelsError, "models", url, err)
	if err == nil {
		w.setModels(now, models)
	}
}

func (w *Worker) setModels(now time.Time, models []string) {
	w.mu.Lock()
	changed := w.setModelsLocked(now, models)
	if changed {
		w.publishLocked()
	}
	w.mu.Unlock()
	if changed {
		w.log.Info("worker models changed", slog.Any(keyModels, models))
		w.notify()
	}
}

func (w *Worker) setModelsLocked(now time.Time, models []string) bool {
	w.st.modelsAt = now
	if w.st.Models != nil && slices.Equal(w.st.Models, models) {
		return false
	}
	w.st.Models = slices.Clone(models)
	return true
}

// setModelsAndAdapters is setModels and setAdapters in one snapshot.
func (w *Worker) setModelsAndAdapters(now time.Time, models []string, as []lora.Info) {
	w.mu.Lock()
	mc := w.setModelsLocked(now, models)
	ac := w.setAdaptersLocked(as)
	if mc || ac {
		w.publishLocked()
	}
	w.mu.Unlock()
	if mc {
		w.log.Info("worker models changed", slog.Any(keyModels, models))
		w.notify()
	}
	if ac {
		w.logAdapters(as)
	}
}

// scrapeGPU reads the worker's dcgm-exporter, when it has one.
func (w *Worker) scrapeGPU(ctx context.Context, now time.Time) {
	url := w.cfg.GPUMetrics
	if url == "" {
		return
	}
	sel := telemetry.Selector(w.cfg.GPUSelector)
	g, err := fetch(ctx, w, url, func(r io.Reader) (telemetry.GPUMetrics, error) { return telemetry.ParseDCGM(r, sel) })
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	if g.Util.Present {
		src := "dcgm /metrics " + g.Util.Metric
		if len(sel) > 0 {
			src += sel.String()
		}
		w.st.GPUUtil = snapshot.Reading{Value: g.Util.V, Source: src, At: now}
	}
	w.publishLocked()
	w.mu.Unlock()
	w.setTelemetryErr(&w.st.GPUError, "gpu metrics", url, err)
}
