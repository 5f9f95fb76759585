package fleet

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/telemetry"
)

// keyContext is the log key of a worker's context size.
const keyContext = "context_tokens"

// statusHealth parses a health endpoint that answers with its status.
func statusHealth(status int, _ io.Reader) (telemetry.HealthResult, error) {
	return telemetry.ParseHealthStatus(status), nil
}

// forModel binds parse to the worker's one configured model, or to ""
// when it has none or several: the parser then picks by what the payload
// names.
func (w *Worker) forModel(parse func(io.Reader, string) (telemetry.Metrics, error)) func(io.Reader) (telemetry.Metrics, error) {
	model := ""
	if len(w.cfg.Models) == 1 {
		model = w.cfg.Models[0]
	}
	return func(r io.Reader) (telemetry.Metrics, error) { return parse(r, model) }
}

// scrapeModelServer probes a server that answers GET /health with its
// status alone and lists its models with max_model_len in /v1/models
// (vLLM, SGLang, trtllm-serve); parse reads its /metrics.
func (w *Worker) scrapeModelServer(ctx context.Context, now time.Time, wasOK bool, parse func(io.Reader) (telemetry.Metrics, error)) error {
	state, err := w.probeHealth(ctx, "/health", statusHealth)
	if state != telemetry.StateReady {
		return err
	}
	w.scrapeMetrics(ctx, now, "/metrics", parse)
	if !wasOK || w.due(now, w.st.modelsAt) {
		w.scrapeModelCards(ctx, now)
	}
	w.scrapeGPU(ctx, now)
	return nil
}

// scrapeTGI probes text-generation-inference: GET /health, /info (the
// model, its context and the batch token budget) and /metrics (tgi_
// series, read against that budget).
func (w *Worker) scrapeTGI(ctx context.Context, now time.Time, wasOK bool) error {
	state, err := w.probeHealth(ctx, "/health", func(status int, body io.Reader) (telemetry.HealthResult, error) {
		return telemetry.ParseTGIHealth(status, body), nil
	})
	if state != telemetry.StateReady {
		return err
	}
	if !wasOK || w.due(now, w.st.infoAt) {
		w.scrapeTGIInfo(ctx, now)
	}
	w.mu.Lock()
	budget := w.st.tgiBatch
	w.mu.Unlock()
	w.scrapeMetrics(ctx, now, "/metrics", func(r io.Reader) (telemetry.Metrics, error) {
		return telemetry.ParseTGI(r, budget)
	})
	w.scrapeGPU(ctx, now)
	return nil
}

// scrapeTGIInfo reads TGI's /info: its model_id is the worker's model
// list (TGI serves one model), max_total_tokens its context.
func (w *Worker) scrapeTGIInfo(ctx context.Context, now time.Time) {
	url := w.base + "/info"
	info, err := fetch(ctx, w, url, telemetry.ParseTGIInfo)
	if ctx.Err() != nil {
		return
	}
	w.setTelemetryErr(&w.st.ModelsError, "info", url, err)
	if err != nil {
		return
	}
	w.mu.Lock()
	w.st.infoAt = now
	w.st.tgiBatch = info.MaxBatchTotalTokens
	w.setContextLocked(info.MaxTotalTokens)
	w.mu.Unlock()
	w.setModels(now, []string{info.ModelID})
}

// scrapeOllama probes Ollama: GET / for health and /api/ps, every round,
// for the loaded models. Ollama loads a pulled model on its first
// request, so the worker serves its configured models as well as the
// loaded ones; with neither, its models stay unknown. Ollama has no load
// metrics: the scheduler relies on Sluice's own in-flight count.
func (w *Worker) scrapeOllama(ctx context.Context, now time.Time) error {
	state, err := w.probeHealth(ctx, "/", telemetry.ParseOllamaRoot)
	if state != telemetry.StateReady {
		return err
	}
	url := w.base + "/api/ps"
	loaded, err := fetch(ctx, w, url, telemetry.ParseOllamaPS)
	if ctx.Err() != nil {
		return nil
	}
	w.setTelemetryErr(&w.st.ModelsError, "models", url, err)
	if err == nil {
		models := slices.Clone(w.cfg.Models)
		ctxTokens := 0
		for _, m := range loaded {
			if !slices.Contains(models, m.Name) {
				models = append(models, m.Name)
			}
			// Several models may be loaded with different contexts; the
			// largest is the most any of them can take.
			ctxTokens = max(ctxTokens, m.ContextLength)
		}
		w.mu.Lock()
		w.setContextLocked(ctxTokens)
		w.mu.Unlock()
		if len(models) > 0 {
			w.setModels(now, models)
		}
	}
	w.scrapeGPU(ctx, now)
	return nil
}

// scrapeModelCards reads /v1/models with max_model_len (vLLM, SGLang,
// trtllm-serve): the list is the worker's models, the largest
// max_model_len its context (adapters report none and share the base
// model's).
func (w *Worker) scrapeModelCards(ctx context.Context, now time.Time) {
	url := w.base + "/v1/models"
	started := time.Now()
	cards, err := fetch(ctx, w, url, telemetry.ParseModelCards)
	if ctx.Err() != nil {
		return
	}
	w.setTelemetryErr(&w.st.ModelsError, "models", url, err)
	if err != nil {
		return
	}
	ctxTokens := 0
	for _, c := range cards {
		ctxTokens = max(ctxTokens, c.MaxModelLen)
	}
	if ctxTokens > 0 {
		w.mu.Lock()
		w.setContextLocked(ctxTokens)
		w.mu.Unlock()
	}
	ids, adapters := w.withRecentLoads(started, telemetry.IDs(cards), adaptersFromCards(cards))
	// One publish for both: a snapshot listing the adapters as models
	// but not yet as adapters would say the worker holds none.
	w.setModelsAndAdapters(now, ids, adapters)
}

// scrapeSlots reads llama.cpp's /slots: the per-slot context size and,
// when /metrics did not say this round, how many slots are busy and how
// much of the KV cache their requests hold.
func (w *Worker) scrapeSlots(ctx context.Context, now time.Time) {
	url := w.base + "/slots"
	s, err := fetch(ctx, w, url, telemetry.ParseLlamaCPPSlots)
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	if len(s.Slots) > 0 && w.st.Running.At.Before(now) {
		update(&w.st.Running, telemetry.Value{V: float64(s.Busy), Present: true, Metric: "is_processing"}, KindLlamaCPP+" /slots ", now)
	}
	// Current builds export no KV-cache series in /metrics: the busy
	// slots' tokens over their n_ctx stand in (telemetry.Slots.KVUsage).
	// An older build's kv_cache_usage_ratio, read this round, wins.
	if s.KVUsage.Present && w.st.KVPressure.At.Before(now) {
		update(&w.st.KVPressure, s.KVUsage, KindLlamaCPP+" /slots ", now)
	}
	if s.NCtx > 0 {
		w.setContextLocked(s.NCtx)
		// With a unified KV cache (llama-server's default in current
		// builds) a slot's n_ctx is the whole cache; otherwise it is one
		// slot's share, and the estimate is low by the slot count.
		w.st.KVCacheTokens = s.NCtx
	}
	if err == nil {
		w.st.CacheReport = slotsReport(s, w.st.bos, !w.st.propsAt.IsZero(), now)
	}
	w.publishLocked()
	w.mu.Unlock()
	w.setTelemetryErr(&w.st.SlotsError, "slots", url, err)
}

// setContextLocked records a context size reported by the worker and
// publishes it when it changed; 0 (not reported) keeps the last one.
// w.mu must be held.
func (w *Worker) setContextLocked(n int) {
	if n <= 0 || n == w.st.ContextTokens {
		return
	}
	w.st.ContextTokens = n
	w.publishLocked()
	w.log.Info("worker context size changed", slog.Int(keyContext, n))
}

// slotsReport turns the prompts llama.cpp's /slots reports into the
// router's view of the worker's cache: the chained block hashes of each
// slot's prompt, cut with the block function the proxy applies to
// requests (prefix.Text, prefix.BlockBytes), after the model's BOS text
// that llama-server's detokenizer puts first. It is nil when no slot
// reports a prompt (current builds report none unless started with
// LLAMA_SERVER_SLOTS_DEBUG=1), or before /props has told the BOS text.
//
// A raw prompt (/v1/completions) held by a slot then has exactly the
// blocks the router computed for it; a chat request's prompt is the
// worker's chat-template text, which is not the router's rendering, so it
// matches little or nothing (see scheduler.CacheReport: silence never
// lowers the router's guess).
func slotsReport(s telemetry.Slots, bos string, bosKnown bool, now time.Time) *snapshot.CacheReport {
	if s.Prompts == 0 || !bosKnown {
		return nil
	}
	rep := &snapshot.CacheReport{Source: "llama.cpp /slots", At: now, Blocks: map[uint64]struct{}{}}
	for _, sl := range s.Slots {
		if !sl.HasPrompt {
			continue
		}
		rep.Slots++
		for _, h := range prefix.Text(strings.TrimPrefix(sl.Prompt, bos), prefix.BlockBytes) {
			rep.Blocks[h] = struct{}{}
		}
	}
	rep.NBlocks = len(rep.Blocks)
	return rep
}

// updatePrefixCacheLocked takes what a /metrics said of the worker's prefix
// cache (vLLM): its KV cache size, and the hit rate between this scrape's
// counters and the previous one's, when prompt tokens were looked up in
// between (a counter that went down, a restart, starts over). w.mu must be
// held.
func (w *Worker) updatePrefixCacheLocked(pc telemetry.PrefixCache, src string, now time.Time) {
	st := &w.st
	if pc.KVTokens.Present {
		st.KVCacheTokens = int(pc.KVTokens.V)
	}
	if pc.KVPoolTokens.Present {
		st.kvPool = int(pc.KVPoolTokens.V)
	}
	if !pc.Queries.Present || !pc.Hits.Present {
		return
	}
	q, h := pc.Queries.V, pc.Hits.V
	if !st.prefixAt.IsZero() && q > st.prefixQueries && h >= st.prefixHits {
		rate := min((h-st.prefixHits)/(q-st.prefixQueries), 1)
		st.PrefixHitRate = snapshot.Reading{Value: rate, Source: src + pc.Hits.Metric + " / " + pc.Queries.Metric, At: now}
	}
	st.prefixQueries, st.prefixHits, st.prefixAt = q, h, now
}
