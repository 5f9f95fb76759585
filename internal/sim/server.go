package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/prefix"
)

// Options tune a Server beyond its engine Params.
type Options struct {
	// TimeScale is how many model seconds pass per real second: 10 runs the
	// worker ten times faster than real time. 0 means 1.
	TimeScale float64
	// Name identifies the worker in logs and seeds its DCGM UUID; it
	// defaults to the model name.
	Name string
	// Hostname and GPUModelName label the DCGM gauge; they default to
	// Name and "NVIDIA A100-SXM4-40GB".
	Hostname     string
	GPUModelName string
	// Logger receives request and lifecycle logs; nil discards them.
	Logger *slog.Logger
	// Emulate names the engine whose chat continuation the server
	// follows: "" or "llamacpp" continues a trailing assistant message
	// always (llama-server's prefill_assistant, on by default); "vllm" or
	// "sglang" only with "continue_final_message": true and
	// "add_generation_prompt": false, and refuses the two together.
	Emulate string
	// LoRA, when set, serves LoRA adapters as vLLM does (lora.go).
	LoRA *LoRA
	// KVEvents, when set, publishes the prefix cache's changes as vLLM's
	// KV-cache events on a ZeroMQ PUB socket listening there (host:port,
	// port 0 picks one), with the replay socket on KVEventsReplay
	// (127.0.0.1:0 when empty); see kvpublish.go.
	KVEvents, KVEventsReplay string
}

// Server is a simulated llama-server: llama.cpp's HTTP API in real time
// over an Engine. It implements http.Handler; Close stops it.
type Server struct {
	p    Params
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux
	uuid string

	realStart time.Time // monotonic anchor of model time
	scale     float64

	wake   chan struct{}
	done   chan struct{}
	ready  chan struct{}
	wg     sync.WaitGroup
	closer sync.Once

	mu       sync.Mutex // guards everything below and the engine
	eng      *Engine
	closed   bool
	isReady  bool
	bucket   rateBucket
	nextResp uint64
	fault    streamFault
	lora     *loraState
	kv       *kvPublisher // nil without Options.KVEvents
}

// rateBucket holds the counters at the last /metrics scrape: llama.cpp
// reports prompt_tokens_seconds and predicted_tokens_seconds over the
// interval since the previous scrape.
type rateBucket struct {
	promptTokens, predictedTokens   int64
	promptSeconds, predictedSeconds float64
}

// NewServer validates p and starts the goroutine that drives its engine.
// Model time starts now, so the model finishes loading after
// p.StartupDelay/TimeScale of real time.
func NewServer(p Params, opts Options) (*Server, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("sim: invalid worker parameters: %w", err)
	}
	if opts.TimeScale == 0 {
		opts.TimeScale = 1
	}
	if !(opts.TimeScale > 0) || math.IsInf(opts.TimeScale, 0) {
		return nil, fmt.Errorf("sim: time scale must be positive and finite, got %v", opts.TimeScale)
	}
	if opts.Name == "" {
		opts.Name = p.Model
	}
	if opts.Hostname == "" {
		opts.Hostname = opts.Name
	}
	if opts.GPUModelName == "" {
		opts.GPUModelName = "NVIDIA A100-SXM4-40GB"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := fnv.New128a()
	fmt.Fprintf(h, "%s/%d", opts.Name, p.Seed)
	sum := h.Sum(nil)
	s := &Server{
		p:         p,
		opts:      opts,
		log:       log.With("worker", opts.Name),
		uuid:      fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16]),
		realStart: time.Now(),
		scale:     opts.TimeScale,
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		ready:     make(chan struct{}),
	}
	s.eng = NewEngine(p, s.realStart)
	s.lora = newLoRAState(opts.LoRA)
	if err := s.startKVEvents(); err != nil {
		return nil, err
	}
	s.routes()
	s.wg.Add(1)
	go s.drive()
	return s, nil
}

// modelNow maps real elapsed time onto model time.
func (s *Server) modelNow() time.Time {
	return s.realStart.Add(time.Duration(float64(time.Since(s.realStart)) * s.scale))
}

// realDelay converts a model-time interval into real time.
func (s *Server) realDelay(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(float64(d) / s.scale))
}

// kick wakes the driver after the engine gained work.
func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// drive is the only goroutine that advances the engine on its own: it
// sleeps until the next engine event (or the end of loading) and processes
// it, firing the callbacks that feed request handlers.
func (s *Server) drive() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		now := s.modelNow()
		s.eng.AdvanceTo(now)
		next, ok := s.eng.NextEvent()
		if !s.isReady {
			if s.eng.Ready(now) {
				s.isReady = true
				close(s.ready)
				s.log.Info("model loaded", "model", s.p.Model)
			} else if !ok || s.eng.ReadyAt().Before(next) {
				next, ok = s.eng.ReadyAt(), true
			}
		}
		s.mu.Unlock()
		if ok {
			timer.Reset(s.realDelay(next.Sub(now)))
		} else {
			timer.Stop()
		}
		select {
		case <-timer.C:
		case <-s.wake:
		case <-s.done:
			return
		}
	}
}

// Ready returns a channel closed once the model has loaded.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Params returns the worker's engine parameters.
func (s *Server) Params() Params { return s.p }

// Name returns the worker's name.
func (s *Server) Name() string { return s.opts.Name }

// Metrics returns a snapshot of the engine at the current model time.
func (s *Server) Metrics() Metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Metrics(s.modelNow())
}

// Close stops the driver goroutine and ends streams in flight. It is safe
// to call more than once; the Server answers 503 afterwards.
func (s *Server) Close() {
	s.closer.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
		s.wg.Wait()
		s.stopKVEvents()
	})
	s.wg.Wait()
}

// ServeHTTP answers like llama-server: while the model loads, everything
// but the model list (and the separate DCGM exporter path) is 503.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models", "/models", "/dcgm/metrics":
	default:
		s.mu.Lock()
		loading, closed := !s.eng.Ready(s.modelNow()), s.closed
		s.mu.Unlock()
		if closed {
			writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Server is shutting down")
			return
		}
		if loading {
			writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Loading model")
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	m.HandleFunc("GET /v1/models", s.handleModels)
	m.HandleFunc("GET /models", s.handleModels)
	m.HandleFunc("GET /props", s.handleProps)
	m.HandleFunc("GET /slots", s.handleSlots)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("GET /dcgm/metrics", s.handleDCGM)
	m.HandleFunc("POST /v1/chat/completions", s.handleGenerate(kindChat))
	m.HandleFunc("POST /chat/completions", s.handleGenerate(kindChat))
	m.HandleFunc("POST /v1/completions", s.handleGenerate(kindCompletions))
	m.HandleFunc("POST /completions", s.handleGenerate(kindCompletions))
	m.HandleFunc("POST /completion", s.handleGenerate(kindNative))
	m.HandleFunc("POST /v1/messages", s.handleGenerate(kindMessages))
	m.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	m.HandleFunc("POST /v1/responses", s.handleGenerate(kindResponses))
	m.HandleFunc("POST /responses", s.handleGenerate(kindResponses))
	m.HandleFunc("POST /tokenize", s.handleTokenize)
	m.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	s.loraRoutes(m)
	m.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found_error", "File Not Found")
	})
	s.mux = m
}

// writeJSON writes v with status; encoding errors of our own types cannot
// happen, and a failed write means the client is gone.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes llama.cpp's (OpenAI-shaped) error body.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg, "type": typ}})
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": append([]any{map[string]any{
			"id":       s.p.Model,
			"object":   "model",
			"created":  s.realStart.Unix(),
			"owned_by": "llamacpp",
			"meta": map[string]any{
				"vocab_type":  2,
				"n_vocab":     128256,
				"n_ctx_train": 8192,
				"n_embd":      4096,
				"n_params":    8030261248,
				"size":        16060522496,
			},
		}}, s.loraCards()...),
	})
}

func (s *Server) slotJSON(st SlotState) map[string]any {
	nRemain := -1
	if st.Busy {
		nRemain = st.Remaining
	}
	idTask := -1
	if st.Busy {
		idTask = int(st.SeqID)
	}
	return map[string]any{
		"id":            st.ID,
		"id_task":       idTask,
		"n_ctx":         s.p.KVTokens,
		"speculative":   false,
		"is_processing": st.Busy,
		"params": map[string]any{
			"n_predict":   -1,
			"temperature": 0.8,
			"top_k":       40,
			"top_p":       0.95,
			"min_p":       0.05,
			"seed":        s.p.Seed,
			"stream":      true,
			"ignore_eos":  false,
		},
		"prompt": st.Prompt,
		"next_token": map[string]any{
			"has_next_token": st.Busy,
			"has_new_line":   false,
			"n_remain":       nRemain,
			"n_decoded":      st.Decoded,
			"stopping_word":  "",
		},
	}
}

// simBOS is the simulated model's BOS text (/props bos_token), which
// starts every prompt /slots reports.
const simBOS = "<|begin_of_text|>"

// handleSlots writes llama-server's GET /slots: every slot with the prompt
// it holds (its occupant's, or its latest one's when free), as builds
// before the prompt went behind LLAMA_SERVER_SLOTS_DEBUG, and current
// ones with it, do.
func (s *Server) handleSlots(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	slots := s.eng.Slots(s.modelNow())
	s.mu.Unlock()
	out := make([]any, len(slots))
	for i, st := range slots {
		out[i] = s.slotJSON(st)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleProps(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": s.slotJSON(SlotState{}),
		"total_slots":                 s.p.Slots,
		"model_alias":                 s.p.Model,
		"model_path":                  "/models/" + s.p.Model + ".gguf",
		"modalities":                  map[string]bool{"vision": false, "audio": false},
		"chat_template":               "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}",
		"bos_token":                   simBOS,
		"eos_token":                   "<|eot_id|>",
		"build_info":                  "sluice-sim",
	})
}

// handleMetrics writes llama.cpp's /metrics: the same names, HELP texts,
// types and order as llama-server (written by hand rather than through
// client_golang so the exposition is byte-for-byte llama.cpp's shape, for
// example n_busy_slots_per_decode typed as a counter as upstream does).
func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	m := s.eng.Metrics(s.modelNow())
	b := s.bucket
	s.bucket = rateBucket{m.PromptTokensTotal, m.PredictedTokensTotal, m.PromptSecondsTotal, m.PredictedSecondsTotal}
	s.mu.Unlock()

	rate := func(tokens int64, secs float64) float64 {
		if tokens <= 0 || secs <= 0 {
			return 0
		}
		return float64(tokens) / secs
	}
	var buf bytes.Buffer
	emit := func(name, help, typ string, v float64) {
		fmt.Fprintf(&buf, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %s\n",
			name, help, name, typ, name, strconv.FormatFloat(v, 'g', -1, 64))
	}
	emit("prompt_tokens_total", "Number of prompt tokens processed.", "counter", float64(m.PromptTokensTotal))
	emit("prompt_seconds_total", "Prompt process time", "counter", m.PromptSecondsTotal)
	emit("tokens_predicted_total", "Number of generation tokens processed.", "counter", float64(m.PredictedTokensTotal))
	emit("tokens_predicted_seconds_total", "Predict process time", "counter", m.PredictedSecondsTotal)
	emit("n_decode_total", "Total number of llama_decode() calls", "counter", float64(m.NDecodeTotal))
	emit("n_tokens_max", "Largest observed n_tokens.", "counter", float64(m.NTokensMax))
	emit("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", "counter",
		float64(m.NBusySlotsTotal)/math.Max(float64(m.NDecodeTotal), 1))
	emit("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "gauge",
		rate(m.PromptTokensTotal-b.promptTokens, m.PromptSecondsTotal-b.promptSeconds))
	emit("predicted_tokens_seconds", "Average generation throughput in tokens/s.", "gauge",
		rate(m.PredictedTokensTotal-b.predictedTokens, m.PredictedSecondsTotal-b.predictedSeconds))
	emit("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", "gauge", m.KVCacheUsageRatio)
	emit("kv_cache_tokens", "KV-cache tokens.", "gauge", float64(m.KVCacheTokens))
	emit("requests_processing", "Number of requests processing.", "gauge", float64(m.RequestsProcessing))
	emit("requests_deferred", "Number of requests deferred.", "gauge", float64(m.RequestsDeferred))

	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Header().Set("Process-Start-Time-Unix", strconv.FormatInt(s.realStart.Unix(), 10))
	_, _ = w.Write(buf.Bytes())
}

// handleDCGM writes the NVIDIA DCGM exporter's GPU utilisation gauge, with
// its usual labels, for scrapers configured with a separate GPU-metrics URL.
func (s *Server) handleDCGM(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	m := s.eng.Metrics(s.modelNow())
	s.mu.Unlock()
	labels := fmt.Sprintf(`gpu="0",UUID=%q,device="nvidia0",modelName=%q,Hostname=%q`, s.uuid, s.opts.GPUModelName, s.opts.Hostname)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %%).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{%s} %d\n",
		labels, int(math.Round(100*m.GPUUtilization)))
	// Frame buffer of the reference A100 40GB: the FP16 weights of an 8B
	// model (about 15 GiB) plus the KV cache in use, in MiB as DCGM reports.
	const totalMiB, weightsMiB = 40960, 15360
	used := weightsMiB + int(math.Round(float64(m.KVCacheTokens)*128/1024)) // 128 KiB per token
	fmt.Fprintf(w, "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\nDCGM_FI_DEV_FB_FREE{%s} %d\n", labels, max(totalMiB-used, 0))
	fmt.Fprintf(w, "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{%s} %d\n", labels, used)
}

// ---- generation endpoints ----

type genKind uint8

const (
	kindChat genKind = iota
	kindCompletions
	kindNative
	kindMessages  // Anthropic's /v1/messages (protocols.go)
	kindResponses // OpenAI's /v1/responses (protocols.go)
)

// genRequest is a parsed generation request of any of the three APIs.
type genRequest struct {
	kind   genKind
	stream bool
	req    Request
	prompt string // native API echoes it back
	// ans is the answer to the request's conversation base, of which
	// skip tokens were prefilled (see text.go): token n of this response
	// is ans.token(skip+n).
	ans   answer
	skip  int
	model string // the request's "model", "" when it names none
}

// charsPerToken is the prompt-length estimate: about four characters of
// English per Llama-3 token.
const charsPerToken = 4

func estimateTokens(chars int) int { return max(1, (chars+charsPerToken-1)/charsPerToken) }

// wireRequest is the union of the fields Sluice's simulator reads from the
// three APIs; everything else (temperature, top_p, ...) is accepted and
// ignored, as a sampler's output does not change the simulated cost.
type wireRequest struct {
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	NPredict            *int            `json:"n_predict"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's (and
	// SGLang's) way to have a trailing assistant message continued.
	ContinueFinalMessage bool  `json:"continue_final_message"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	// SimPromptTokens is an extension: the prompt length in tokens, for
	// load generators that do not want to send long texts.
	SimPromptTokens *int `json:"sim_prompt_tokens"`
}

func parseGenRequest(kind genKind, body io.Reader, emulate string) (genRequest, error) {
	if kind == kindMessages || kind == kindResponses {
		return parseTypedRequest(kind, body)
	}
	var wr wireRequest
	dec := json.NewDecoder(body)
	if err := dec.Decode(&wr); err != nil {
		return genRequest{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	g := genRequest{kind: kind, stream: wr.Stream, req: Request{IgnoreEOS: wr.IgnoreEOS}, model: wr.Model}
	var chars, tokens int
	var err error
	var base string
	switch kind {
	case kindChat:
		chars, err = messagesChars(wr.Messages)
		if err == nil {
			prefill := true
			if emulate == "vllm" || emulate == "sglang" {
				if wr.ContinueFinalMessage && (wr.AddGenerationPrompt == nil || *wr.AddGenerationPrompt) {
					return genRequest{}, errors.New("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
				}
				prefill = wr.ContinueFinalMessage
			}
			var msgs []chatMessage
			json.Unmarshal(wr.Messages, &msgs) // messagesChars checked the shape
			var nb int
			base, g.skip, nb = splitChat(msgs, prefill)
			if nb < len(msgs) { // the prefill's own text counts as its tokens
				chars = 0
				for _, m := range msgs[:nb] {
					chars += len(m.Role) + len(contentText(m.Content))
				}
			}
		}
	default:
		g.prompt, chars, tokens, err = promptSize(wr.Prompt)
		base, g.skip = splitCompletion(g.prompt)
		if g.skip > 0 {
			chars = len(base)
		}
	}
	if err != nil {
		return genRequest{}, err
	}
	g.ans = answerTo(base)
	g.req.PromptTokens = tokens + estimateTokens(chars) + g.skip
	if tokens > 0 && chars == 0 {
		g.req.PromptTokens = tokens
	}
	if wr.SimPromptTokens != nil {
		if *wr.SimPromptTokens < 1 {
			return genRequest{}, errors.New("'sim_prompt_tokens' must be at least 1")
		}
		g.req.PromptTokens = *wr.SimPromptTokens + g.skip
	} else {
		// The prompt cache: blocks of the rendered text, as the router
		// guesses them (a real server's blocks are of real tokens).
		g.req.Prefix, g.req.PrefixBlockTokens = prefix.FromFields(wr.Messages, wr.Prompt, prefix.BlockBytes), prefix.BlockTokens
		// What /slots shows the slot holding: llama-server's detokenized
		// prompt starts with the BOS text /props names, and the rest is
		// this server's "chat template", the router's rendering.
		g.req.Text = simBOS + prefix.PromptText(wr.Messages, wr.Prompt)
	}
	limit := -1
	for _, v := range []*int{wr.NPredict, wr.MaxTokens, wr.MaxCompletionTokens} {
		if v == nil {
			continue
		}
		if *v < -1 {
			return genRequest{}, fmt.Errorf("token limit must be -1 (no limit) or more, got %d", *v)
		}
		limit = *v
	}
	if limit == 0 {
		return genRequest{}, errors.New("token limit must not be 0")
	}
	g.req.MaxTokens = max(limit, 0)
	return g, nil
}

// messagesChars sums the text of chat messages (string content or an
// array of text parts).
func messagesChars(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("'messages' is required")
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return 0, fmt.Errorf("'messages' must be an array of messages: %w", err)
	}
	if len(msgs) == 0 {
		return 0, errors.New("'messages' must not be empty")
	}
	n := 0
	for i, m := range msgs {
		if m.Role == "" {
			return 0, fmt.Errorf("messages[%d]: 'role' is required", i)
		}
		n += len(m.Role)
		if len(m.Content) == 0 || string(m.Content) == "null" {
			continue
		}
		var text string
		if err := json.Unmarshal(m.Content, &text); err == nil {
			n += len(text)
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return 0, fmt.Errorf("messages[%d]: 'content' must be a string or an array of parts", i)
		}
		for _, p := range parts {
			n += len(p.Text)
		}
	}
	return n, nil
}

// promptSize reads a completion prompt: a string, an array of strings, or
// an array of token ids. It returns the text, its characters and the count
// of token ids given directly.
func promptSize(raw json.RawMessage) (text string, chars, tokens int, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", 0, 0, errors.New("\"prompt\" must be provided")
	}
	if err := json.Unmarshal(raw, &text); err == nil {
		return text, len(text), 0, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return "", 0, 0, errors.New("\"prompt\" must be a string, an array of strings or an array of tokens")
	}
	var sb strings.Builder
	for _, it := range items {
		var str string
		var tok int
		var toks []int
		switch {
		case json.Unmarshal(it, &str) == nil:
			sb.WriteString(str)
		case json.Unmarshal(it, &tok) == nil:
			tokens++
		case json.Unmarshal(it, &toks) == nil:
			tokens += len(toks)
		default:
			return "", 0, 0, errors.New("\"prompt\" must be a string, an array of strings or an array of tokens")
		}
	}
	return sb.String(), sb.Len(), tokens, nil
}

// progress is one request's view of its sequence, written by engine
// callbacks (under s.mu) and read by the handler.
type progress struct {
	mu     sync.Mutex
	n      int
	done   bool
	res    Result
	notify chan struct{}
}

func (p *progress) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

func (p *progress) snapshot() (int, bool, Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.done, p.res
}

func (s *Server) handleGenerate(kind genKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeError := errorWriter(kind) // in the API's own shape
		g, err := parseGenRequest(kind, http.MaxBytesReader(w, r.Body, 64<<20), s.opts.Emulate)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		if !s.loraServes(w, g.model) {
			return
		}
		if !g.req.IgnoreEOS {
			// Where the answer stops of itself is the base's, not a draw.
			rest := g.ans.length(s.p) - g.skip
			if rest <= 0 {
				s.answerAtEOS(w, g)
				return
			}
			g.req.Output = rest
		}
		pr := &progress{notify: make(chan struct{}, 1)}
		cb := Callbacks{
			OnToken: func(_ time.Time, n int) {
				pr.mu.Lock()
				pr.n = n
				pr.mu.Unlock()
				pr.signal()
			},
			OnDone: func(_ time.Time, res Result) {
				pr.mu.Lock()
				pr.done, pr.res = true, res
				pr.mu.Unlock()
				pr.signal()
			},
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Server is shutting down")
			return
		}
		seq, err := s.eng.Submit(s.modelNow(), g.req, cb)
		s.nextResp++
		id := s.nextResp
		s.mu.Unlock()
		if errors.Is(err, ErrContextExceeded) {
			writeError(w, http.StatusBadRequest, "exceed_context_size_error",
				fmt.Sprintf("the request exceeds the available context size (%d tokens), try increasing it", s.p.KVTokens))
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		s.kick()
		cancel := func(why string) {
			s.mu.Lock()
			s.eng.Cancel(s.modelNow(), seq)
			s.mu.Unlock()
			s.kick()
			s.log.Debug("request cancelled", "seq", seq.ID(), "reason", why)
		}
		out := responder{s: s, g: g, id: id, seq: seq, created: time.Now().Unix()}
		if g.stream {
			s.stream(w, r, pr, &out, cancel)
			return
		}
		for {
			select {
			case <-pr.notify:
			case <-r.Context().Done():
				cancel("client gone")
				return
			case <-s.done:
				writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Server is shutting down")
				return
			}
			n, done, res := pr.snapshot()
			if done {
				writeJSON(w, http.StatusOK, out.final(n, res))
				return
			}
		}
	}
}

// stream writes one SSE event per token and the final event(s).
func (s *Server) stream(w http.ResponseWriter, r *http.Request, pr *progress, out *responder, cancel func(string)) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		cancel("flush failed")
		return
	}
	var buf bytes.Buffer
	out.writeStart(&buf) // sent with the first token
	sent := 0
	fault := s.takeFault()
	abortAt := fault.k
	for {
		select {
		case <-pr.notify:
		case <-r.Context().Done():
			cancel("client gone")
			return
		case <-s.done:
			return
		}
		n, done, res := pr.snapshot()
		for ; sent < n && (abortAt == 0 || sent < abortAt); sent++ {
			out.writeChunk(&buf, sent+1)
		}
		if abortAt > 0 && sent == abortAt {
			s.playFault(w, r, &buf, fault, cancel)
			return
		}
		if done {
			out.writeEnd(&buf, n, res)
		}
		if buf.Len() > 0 {
			if _, err := w.Write(buf.Bytes()); err != nil {
				cancel("write failed")
				return
			}
			if err := rc.Flush(); err != nil {
				cancel("flush failed")
				return
			}
			buf.Reset()
		}
		if done {
			return
		}
	}
}

func writeEvent(buf *bytes.Buffer, v any) {
	buf.WriteString("data: ")
	b, _ := json.Marshal(v)
	buf.Write(b)
	buf.WriteString("\n\n")
}

// responder builds the JSON bodies of one request in its API's shape.
type responder struct {
	s       *Server
	g       genRequest
	id      uint64
	seq     *Seq
	created int64
}

func (o *responder) respID() string {
	if o.g.kind == kindChat {
		return fmt.Sprintf("chatcmpl-sim%d", o.id)
	}
	return fmt.Sprintf("cmpl-sim%d", o.id)
}

func (o *responder) text(n int) string {
	var sb strings.Builder
	for i := 1; i <= n; i++ {
		sb.WriteString(o.g.ans.token(o.g.skip + i))
	}
	return sb.String()
}

func usage(res Result) map[string]any {
	return map[string]any{
		"completion_tokens": res.CompletionTokens,
		"prompt_tokens":     res.PromptTokens,
		"total_tokens":      res.PromptTokens + res.CompletionTokens,
		// OpenAI's (and vLLM's) report of the prompt tokens served from
		// the prefix cache.
		"prompt_tokens_details": map[string]int{"cached_tokens": res.CachedTokens},
	}
}

// timings is llama.cpp's per-request timing object, in model time.
func timings(res Result) map[string]any {
	per := func(n int, d time.Duration) (msPerTok, perSec float64) {
		if n == 0 || d <= 0 {
			return 0, 0
		}
		ms := float64(d) / float64(time.Millisecond)
		return ms / float64(n), float64(n) / d.Seconds()
	}
	predicted := max(res.CompletionTokens-1, 0) // the first token comes with the prompt step
	pTok, pSec := per(res.PromptTokens-res.CachedTokens, res.PromptTime)
	gTok, gSec := per(predicted, res.GenTime)
	return map[string]any{
		"cache_n":                res.CachedTokens,
		"prompt_n":               res.PromptTokens - res.CachedTokens,
		"prompt_ms":              float64(res.PromptTime) / float64(time.Millisecond),
		"prompt_per_token_ms":    pTok,
		"prompt_per_second":      pSec,
		"predicted_n":            res.CompletionTokens,
		"predicted_ms":           float64(res.GenTime) / float64(time.Millisecond),
		"predicted_per_token_ms": gTok,
		"predicted_per_second":   gSec,
	}
}

func finishReason(res Result) string {
	if res.FinishReason == "" {
		return FinishStop
	}
	return res.FinishReason
}

func stopType(res Result) string {
	if res.FinishReason == FinishLength {
		return "limit"
	}
	return "eos"
}

// chunk is the streaming event for token n.
func (o *responder) chunk(n int) any {
	text := o.g.ans.token(o.g.skip + n)
	switch o.g.kind {
	case kindChat:
		delta := map[string]any{"content": text}
		if n == 1 {
			delta["role"] = "assistant"
		}
		return map[string]any{
			"choices":            []any{map[string]any{"finish_reason": nil, "index": 0, "delta": delta}},
			"created":            o.created,
			"id":                 o.respID(),
			"model":              o.s.p.Model,
			"system_fingerprint": "sluice-sim",
			"object":             "chat.completion.chunk",
		}
	case kindCompletions:
		return map[string]any{
			"choices":            []any{map[string]any{"finish_reason": nil, "index": 0, "text": text, "logprobs": nil}},
			"created":            o.created,
			"id":                 o.respID(),
			"model":              o.s.p.Model,
			"system_fingerprint": "sluice-sim",
			"object":             "text_completion",
		}
	default:
		return map[string]any{
			"index":            0,
			"content":          text,
			"tokens":           []int{},
			"stop":             false,
			"id_slot":          -1,
			"tokens_predicted": n,
			"tokens_evaluated": o.g.req.PromptTokens,
		}
	}
}

// lastChunk is the streaming event that carries the finish reason and
// usage.
func (o *responder) lastChunk(n int, res Result) any {
	switch o.g.kind {
	case kindChat:
		return o.finished("chat.completion.chunk", map[string]any{"finish_reason": finishReason(res), "index": 0, "delta": map[string]any{}}, res)
	case kindCompletions:
		return o.finished("text_completion", map[string]any{"finish_reason": finishReason(res), "index": 0, "text": "", "logprobs": nil}, res)
	default:
		body := o.native(n, res)
		body["content"] = ""
		return body
	}
}

// final is the non-streaming response body.
func (o *responder) final(n int, res Result) any {
	switch o.g.kind {
	case kindChat:
		return o.finished("chat.completion", map[string]any{
			"finish_reason": finishReason(res),
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": o.text(n)},
		}, res)
	case kindCompletions:
		return o.finished("text_completion", map[string]any{"finish_reason": finishReason(res), "index": 0, "text": o.text(n), "logprobs": nil}, res)
	case kindMessages:
		return o.message(n, res)
	case kindResponses:
		return o.response(n, res)
	default:
		return o.native(n, res)
	}
}

// finished is the OpenAI envelope of an answer's last object: its one
// choice, with usage and llama.cpp's timings.
func (o *responder) finished(object string, choice map[string]any, res Result) map[string]any {
	return map[string]any{
		"choices":            []any{choice},
		"created":            o.created,
		"id":                 o.respID(),
		"model":              o.s.p.Model,
		"system_fingerprint": "sluice-sim",
		"object":             object,
		"usage":              usage(res),
		"timings":            timings(res),
	}
}

// native is llama.cpp's /completion result object.
func (o *responder) native(n int, res Result) map[string]any {
	return map[string]any{
		"index":            0,
		"content":          o.text(n),
		"tokens":           []int{},
		"id_slot":          -1,
		"stop":             true,
		"model":            o.s.p.Model,
		"tokens_predicted": res.CompletionTokens,
		"tokens_evaluated": res.PromptTokens,
		"generation_settings": map[string]any{
			"n_predict":  predictOrUnlimited(o.g.req.MaxTokens),
			"ignore_eos": o.g.req.IgnoreEOS,
			"seed":       o.s.p.Seed,
		},
		"prompt":        o.g.prompt,
		"has_new_line":  false,
		"truncated":     false,
		"stop_type":     stopType(res),
		"stopping_word": "",
		"tokens_cached": res.PromptTokens + res.CompletionTokens,
		"timings":       timings(res),
	}
}

func predictOrUnlimited(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}
