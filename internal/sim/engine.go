package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
)

// Finish reasons reported in Result.FinishReason, with llama.cpp's and
// OpenAI's spelling.
const (
	// FinishStop means the model chose to stop (it emitted end-of-stream).
	FinishStop = "stop"
	// FinishLength means the token budget (max_tokens / n_predict, or the
	// KV cache for a sequence that alone outgrew it) ran out.
	FinishLength = "length"
)

// Errors returned by Engine.Submit.
var (
	// ErrContextExceeded means the prompt alone does not fit in the KV cache,
	// so the request could never run.
	ErrContextExceeded = errors.New("sim: the request exceeds the available context size")
	// ErrInvalidRequest means the request itself is malformed.
	ErrInvalidRequest = errors.New("sim: invalid request")
)

// Params describes one simulated GPU worker. DefaultParams returns values
// grounded in published measurements (see the package documentation); the
// zero value is not usable.
type Params struct {
	// Model is the model name the worker reports and accepts.
	Model string
	// Slots is the number of sequences decoded together (llama-server's
	// --parallel). Further requests wait in the worker's FIFO queue.
	Slots int
	// KVTokens is the KV-cache capacity in tokens, shared by all slots.
	KVTokens int
	// PrefillTokensPerSec is the prompt-processing rate on the reference card.
	PrefillTokensPerSec float64
	// BatchTokens is the most tokens one step carries, llama-server's
	// --batch-size (n_batch, 2048 by default) or vLLM's
	// max_num_batched_tokens: the decoding sequences' tokens go in first,
	// then prompt tokens, in admission order, up to the budget, so a longer
	// prompt is prefilled in chunks over several steps (chunked prefill).
	// 0 means no budget: each prompt is prefilled whole in one step.
	BatchTokens int
	// DecodeBase and DecodePerSeq give the decode step time on the reference
	// card with n sequences decoding: DecodeBase + DecodePerSeq*n.
	DecodeBase, DecodePerSeq time.Duration
	// InterferenceScale and InterferenceSigma shape the collision factor
	// applied to a step carrying n >= 2 sequences:
	// 1 + InterferenceScale*(n-1)*L with L ~ LogNormal(0, InterferenceSigma),
	// drawn afresh whenever the batch's membership changes.
	// InterferenceScale 0 turns interference off.
	InterferenceScale, InterferenceSigma float64
	// Speed is the card's speed relative to the reference card: every step
	// time is divided by it (1 = reference, 0.6 = a slower card).
	Speed float64
	// StartupDelay is how long the model takes to load; the worker says
	// "Loading model" and runs nothing until it has passed.
	StartupDelay time.Duration
	// Seed makes every random draw (output lengths, interference)
	// reproducible.
	Seed int64
	// OutputMedian and OutputSigma give the log-normal distribution of
	// natural output lengths (median tokens, sigma of the log); draws are
	// clamped to [OutputMin, OutputMax].
	OutputMedian         float64
	OutputSigma          float64
	OutputMin, OutputMax int
	// Slowdowns make the card slower for a while: a noisy neighbour, a
	// thermal throttle, a card shared with another job. Every step that
	// starts in a slowdown's window takes 1/Factor as long.
	Slowdowns []Slowdown
}

// Slowdown is one spell of reduced speed.
type Slowdown struct {
	// After is when it starts, counted from the engine's creation.
	After time.Duration
	// For is how long it lasts; 0 means until the end.
	For time.Duration
	// Factor multiplies the card's speed, in (0, 1] to slow it down.
	Factor float64
}

// Reference numbers for DefaultParams; the package documentation and
// docs/sim.md cite their sources.
const (
	// KVBytesPerToken is the FP16 KV-cache size of one Llama-3-8B token:
	// 2 (K and V) * 32 layers * 8 KV heads * 128 head dim * 2 bytes.
	KVBytesPerToken = 2 * 32 * 8 * 128 * 2
	// DefaultKVBytes is the KV budget DefaultParams assumes (4 GiB, what
	// llama-server allocates for -c 32768).
	DefaultKVBytes = 4 << 30
)

// DefaultParams returns a Llama-3-8B-Instruct (16-bit weights) worker on the
// reference card, an NVIDIA A100 40GB: 75 tokens/s single-stream decode,
// 5,000 prompt tokens/s, 4 slots and a 32,768-token KV cache. Use
// Speed = 2 for an H100.
func DefaultParams() Params {
	return Params{
		Model:               "llama-3-8b-instruct",
		Slots:               4,
		KVTokens:            DefaultKVBytes / KVBytesPerToken,
		PrefillTokensPerSec: 5000,
		BatchTokens:         2048,
		DecodeBase:          12900 * time.Microsecond,
		DecodePerSeq:        400 * time.Microsecond,
		InterferenceScale:   0.1,
		InterferenceSigma:   1.0,
		Speed:               1,
		StartupDelay:        0,
		Seed:                1,
		OutputMedian:        180,
		OutputSigma:         1.0,
		OutputMin:           10,
		OutputMax:           2000,
	}
}

// Validate reports every unusable field, joined.
func (p Params) Validate() error {
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if p.Model == "" {
		bad("model", "must not be empty")
	}
	if p.Slots < 1 {
		bad("slots", "must be at least 1, got %d", p.Slots)
	}
	if p.KVTokens < 2 {
		bad("kv_tokens", "must be at least 2, got %d", p.KVTokens)
	}
	if !(p.PrefillTokensPerSec > 0) || math.IsInf(p.PrefillTokensPerSec, 0) {
		bad("prefill_tokens_per_sec", "must be positive and finite, got %v", p.PrefillTokensPerSec)
	}
	if p.BatchTokens < 0 || p.BatchTokens > 0 && p.BatchTokens <= p.Slots {
		bad("batch_tokens", "must be 0 (no budget) or more than slots (%d), got %d", p.Slots, p.BatchTokens)
	}
	if p.DecodeBase <= 0 {
		bad("decode_base", "must be positive, got %v", p.DecodeBase)
	}
	if p.DecodePerSeq < 0 {
		bad("decode_per_seq", "must not be negative, got %v", p.DecodePerSeq)
	}
	if p.InterferenceScale < 0 || math.IsNaN(p.InterferenceScale) || math.IsInf(p.InterferenceScale, 0) {
		bad("interference_scale", "must be finite and not negative, got %v", p.InterferenceScale)
	}
	if p.InterferenceSigma < 0 || math.IsNaN(p.InterferenceSigma) || math.IsInf(p.InterferenceSigma, 0) {
		bad("interference_sigma", "must be finite and not negative, got %v", p.InterferenceSigma)
	}
	if !(p.Speed > 0) || math.IsInf(p.Speed, 0) {
		bad("speed", "must be positive and finite, got %v", p.Speed)
	}
	if p.StartupDelay < 0 {
		bad("startup_delay", "must not be negative, got %v", p.StartupDelay)
	}
	if !(p.OutputMedian >= 1) || math.IsInf(p.OutputMedian, 0) {
		bad("output_median", "must be at least 1, got %v", p.OutputMedian)
	}
	if p.OutputSigma < 0 || math.IsNaN(p.OutputSigma) || math.IsInf(p.OutputSigma, 0) {
		bad("output_sigma", "must be finite and not negative, got %v", p.OutputSigma)
	}
	if p.OutputMin < 1 {
		bad("output_min", "must be at least 1, got %d", p.OutputMin)
	}
	if p.OutputMax < p.OutputMin {
		bad("output_max", "must be at least output_min (%d), got %d", p.OutputMin, p.OutputMax)
	}
	for i, sd := range p.Slowdowns {
		if !(sd.Factor > 0) || sd.Factor > 1000 || math.IsInf(sd.Factor, 0) {
			bad(fmt.Sprintf("slowdowns[%d].factor", i), "must be in (0, 1000], got %v", sd.Factor)
		}
		if sd.After < 0 || sd.For < 0 {
			bad(fmt.Sprintf("slowdowns[%d]", i), "after and for must not be negative, got %v and %v", sd.After, sd.For)
		}
	}
	return errors.Join(errs...)
}

// Request is one generation as the engine sees it.
type Request struct {
	// PromptTokens is the prompt length; values below 1 count as 1.
	PromptTokens int
	// MaxTokens caps the completion (0 or less: no cap but OutputMax).
	MaxTokens int
	// IgnoreEOS makes the sequence produce exactly MaxTokens tokens
	// (OutputMax when MaxTokens is not set), as llama.cpp's ignore_eos.
	IgnoreEOS bool
	// Output, when positive, is where the sequence stops of itself (its
	// EOS), decided by the caller instead of drawn: the HTTP server's
	// answers are a function of their prompt (text.go).
	Output int
	// Prefix holds the chained hashes of the prompt's blocks of
	// PrefixBlockTokens tokens (hash i covers blocks 0..i, as Mooncake's
	// hash_ids and package prefix's hashes do). The leading blocks found
	// in the worker's prefix cache are not prefilled again. Empty, or
	// PrefixBlockTokens below 1: no prefix caching for this request.
	Prefix            []uint64
	PrefixBlockTokens int
	// Text is the prompt's text as the worker's /slots reports it; the
	// engine only hands it back (SlotState.Prompt).
	Text string
}

// Result is what a finished (or cancelled) sequence reports.
type Result struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is how many prompt tokens were found in the worker's
	// prefix cache, and not prefilled, at the sequence's last admission.
	CachedTokens int
	// Preempted counts how often the sequence lost its KV cache and had to
	// recompute its prefill.
	Preempted int
	// FinishReason is FinishStop or FinishLength; empty when Cancelled.
	FinishReason string
	Cancelled    bool
	// Submitted, FirstToken and Finished are the sequence's milestones
	// (FirstToken is zero if no token was produced).
	Submitted, FirstToken, Finished time.Time
	// PromptTime is the time spent in steps that prefilled this sequence;
	// GenTime the time spent in steps that decoded it (llama.cpp's
	// t_prompt_processing and t_token_generation).
	PromptTime, GenTime time.Duration
}

// Callbacks are how the engine reports a sequence's progress. Any may be
// nil. They run synchronously inside Engine calls, in time order, and must
// not block; they may call Submit and Cancel on the same engine.
type Callbacks struct {
	// OnFirstToken fires once, when the first completion token is ready.
	OnFirstToken func(at time.Time)
	// OnToken fires for every completion token; n is the count so far
	// (1-based). Tokens are never repeated after a preemption.
	OnToken func(at time.Time, n int)
	// OnDone fires once when the sequence finishes or is cancelled.
	OnDone func(at time.Time, res Result)
}

type seqState uint8

const (
	stateQueued seqState = iota
	stateRunning
	stateDone
)

// Seq is a handle on one submitted sequence, used to cancel it.
type Seq struct {
	id        uint64
	req       Request
	cb        Callbacks
	target    int
	reason    string // finish reason when target is reached
	state     seqState
	slot      int
	generated int
	kv        int // tokens resident in the KV cache
	prefill   int // prompt tokens still to prefill; 0 once decoding
	chunk     int // prompt tokens the current step prefills
	inStep    bool
	res       Result
}

// ID returns the engine-unique, increasing id of the sequence.
func (s *Seq) ID() uint64 { return s.id }

// Target returns how many completion tokens the sequence will produce if it
// runs to the end (drawn at Submit).
func (s *Seq) Target() int { return s.target }

type interval struct{ from, to time.Time }

// Engine is a discrete-event model of one GPU worker doing continuous
// batching. It is not safe for concurrent use and never reads the clock:
// every method takes the current model time and first processes every step
// that ends at or before it.
type Engine struct {
	p       Params
	rng     *rand.Rand
	readyAt time.Time
	created time.Time // when the engine was made; slowdowns count from it
	now     time.Time
	nextID  uint64

	queue   []*Seq   // FIFO of deferred sequences, front first
	running []*Seq   // resident sequences in admission order
	slots   []*Seq   // slot id -> occupant
	texts   []string // slot id -> Request.Text of its latest occupant
	kvUsed  int

	busy         bool
	stepStart    time.Time
	stepEnd      time.Time
	stepDur      time.Duration
	step         []*Seq // sequences carried by the current step
	startPending bool
	startAt      time.Time
	factor       float64
	changed      bool // batch membership changed since factor was drawn

	inCallback bool
	pendingCB  []func()

	busyLog []interval
	prefix  *prefixCache // created at the first request with a prefix
	// onCache, when set, receives the prefix cache's changes as vLLM's
	// KV-cache events (kvevents.go); cacheLog is its scratch.
	onCache  func(at time.Time, events []kvevents.Event)
	cacheLog cacheLog

	m counters
}

type counters struct {
	promptTokens     int64
	promptSeconds    float64
	predictedTokens  int64
	predictedSeconds float64
	nDecode          int64
	nBusySlots       int64
	nTokensMax       int
	preemptions      int64
	finished         int64
	cancelled        int64
	cachedTokens     int64
}

// NewEngine returns an idle engine whose model finishes loading at
// start+p.StartupDelay. It panics if p does not validate: parameters are
// programmer input, check them with Params.Validate first.
func NewEngine(p Params, start time.Time) *Engine {
	if err := p.Validate(); err != nil {
		panic(fmt.Sprintf("sim.NewEngine: %v", err))
	}
	seed := uint64(p.Seed)
	return &Engine{
		p:       p,
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		readyAt: start.Add(p.StartupDelay),
		created: start,
		now:     start,
		slots:   make([]*Seq, p.Slots),
		texts:   make([]string, p.Slots),
		factor:  1,
	}
}

// slowdown returns the speed factor in force at t: the product of the
// slowdowns whose windows contain t, 1 when none does.
func (e *Engine) slowdown(t time.Time) float64 {
	f := 1.0
	for _, sd := range e.p.Slowdowns {
		from := e.created.Add(sd.After)
		if !t.Before(from) && (sd.For == 0 || t.Before(from.Add(sd.For))) {
			f *= sd.Factor
		}
	}
	return f
}

// Params returns the parameters the engine was built with.
func (e *Engine) Params() Params { return e.p }

// Ready reports whether the model has finished loading at now.
func (e *Engine) Ready(now time.Time) bool { return !now.Before(e.readyAt) }

// ReadyAt returns when the model finishes loading.
func (e *Engine) ReadyAt() time.Time { return e.readyAt }

// Submit adds a request at now. The sequence joins the next step if a slot
// and room for its prompt in the KV cache are free, otherwise it waits in
// the FIFO queue. It fails only for a request that could never run.
func (e *Engine) Submit(now time.Time, r Request, cb Callbacks) (*Seq, error) {
	if r.PromptTokens < 1 {
		r.PromptTokens = 1
	}
	if r.PromptTokens+1 > e.p.KVTokens {
		return nil, fmt.Errorf("%w: prompt of %d tokens, KV cache of %d", ErrContextExceeded, r.PromptTokens, e.p.KVTokens)
	}
	e.advance(now)
	e.nextID++
	s := &Seq{id: e.nextID, req: r, cb: cb, slot: -1, prefill: r.PromptTokens}
	s.target, s.reason = e.drawTarget(r)
	s.res.PromptTokens = r.PromptTokens
	s.res.Submitted = e.now
	e.queue = append(e.queue, s)
	e.admit()
	e.maybeStart(e.now)
	return s, nil
}

// drawTarget decides how many tokens a request will produce and why it
// will stop.
func (e *Engine) drawTarget(r Request) (int, string) {
	if r.IgnoreEOS {
		if r.MaxTokens > 0 {
			return r.MaxTokens, FinishLength
		}
		return e.p.OutputMax, FinishLength
	}
	n := r.Output
	if n <= 0 {
		n = int(math.Round(e.p.OutputMedian * math.Exp(e.p.OutputSigma*e.rng.NormFloat64())))
		n = min(max(n, e.p.OutputMin), e.p.OutputMax)
	}
	if r.MaxTokens > 0 && n >= r.MaxTokens {
		return r.MaxTokens, FinishLength
	}
	return n, FinishStop
}

// Cancel ends s at now, as a client disconnect does: its slot and KV are
// freed at once and OnDone reports Cancelled. Cancelling a finished
// sequence does nothing.
func (e *Engine) Cancel(now time.Time, s *Seq) {
	e.advance(now)
	if s == nil || s.state == stateDone {
		return
	}
	switch s.state {
	case stateQueued:
		for i, q := range e.queue {
			if q == s {
				e.queue = append(e.queue[:i], e.queue[i+1:]...)
				break
			}
		}
	case stateRunning:
		e.evict(s)
	}
	s.state = stateDone
	s.res.Cancelled = true
	s.res.Finished = e.now
	s.res.CompletionTokens = s.generated
	e.m.cancelled++
	e.admit()
	e.emit(func() {
		if s.cb.OnDone != nil {
			s.cb.OnDone(s.res.Finished, s.res)
		}
	})
	e.flush()
	e.maybeStart(e.now)
}

// evict removes a running sequence from its slot and the KV cache.
func (e *Engine) evict(s *Seq) {
	for i, r := range e.running {
		if r == s {
			e.running = append(e.running[:i], e.running[i+1:]...)
			break
		}
	}
	e.slots[s.slot] = nil
	s.slot = -1
	e.kvUsed -= s.kv
	s.kv = 0
	e.changed = true
}

// NextEvent returns when the engine next changes state on its own (the
// current step ends, or the first step starts once the model has loaded),
// and false when it is idle.
func (e *Engine) NextEvent() (time.Time, bool) {
	switch {
	case e.busy:
		return e.stepEnd, true
	case e.startPending:
		return e.startAt, true
	}
	return time.Time{}, false
}

// AdvanceTo processes every step that ends at or before t, firing callbacks
// in time order. Times before the engine's current time are treated as the
// current time.
func (e *Engine) AdvanceTo(t time.Time) { e.advance(t) }

func (e *Engine) advance(t time.Time) {
	if e.inCallback {
		// Called from a callback: time is the callback's, already current.
		return
	}
	for {
		switch {
		case e.busy && !e.stepEnd.After(t):
			e.now = e.stepEnd
			e.finishStep()
		case e.startPending && !e.startAt.After(t):
			e.now = e.startAt
			e.startPending = false
			e.startStep(e.now)
		default:
			if t.After(e.now) {
				e.now = t
			}
			return
		}
	}
}

// maybeStart begins a step at t if the engine is idle and has work.
func (e *Engine) maybeStart(t time.Time) {
	if e.busy || e.startPending || len(e.running) == 0 && len(e.queue) == 0 {
		return
	}
	if t.Before(e.readyAt) {
		e.startPending, e.startAt = true, e.readyAt
		return
	}
	e.startStep(t)
}

// admit moves deferred sequences into free slots, in FIFO order, while
// their prefill fits in the KV cache. A sequence admitted while a step is
// running holds its slot and KV and is prefilled by the next step, as a
// llama-server slot is assigned on arrival and processed at the next batch.
func (e *Engine) admit() {
	for len(e.queue) > 0 && len(e.running) < e.p.Slots && e.kvUsed+e.queue[0].prefill <= e.p.KVTokens {
		s := e.queue[0]
		e.queue = e.queue[1:]
		for i, o := range e.slots {
			if o == nil {
				e.slots[i], s.slot = s, i
				e.texts[i] = s.req.Text
				break
			}
		}
		s.state = stateRunning
		s.kv = s.prefill
		e.kvUsed += s.kv
		s.prefill -= e.cachedPrefill(s)
		e.running = append(e.running, s)
		e.changed = true
	}
}

// startStep admits what fits and schedules the end of one engine step.
func (e *Engine) startStep(t time.Time) {
	e.admit()
	if len(e.running) == 0 {
		return
	}
	// The batch, as llama-server's update_slots builds it: one token for
	// each decoding sequence first, then prompt tokens, in admission
	// order, while the budget lasts.
	var prefillTokens, decoding int
	for _, s := range e.running {
		if s.prefill == 0 {
			decoding++
		}
	}
	budget := math.MaxInt
	if e.p.BatchTokens > 0 {
		budget = e.p.BatchTokens - decoding
	}
	for _, s := range e.running {
		s.chunk = 0
		if s.prefill > 0 && budget > 0 {
			s.chunk = min(s.prefill, budget)
			budget -= s.chunk
			prefillTokens += s.chunk
		}
	}
	if e.changed {
		e.changed = false
		e.factor = 1
		if n := len(e.running); n >= 2 && e.p.InterferenceScale > 0 {
			l := math.Exp(e.p.InterferenceSigma * e.rng.NormFloat64())
			e.factor = 1 + e.p.InterferenceScale*float64(n-1)*l
		}
	}
	d := e.StepTime(prefillTokens, decoding, e.factor)
	if f := e.slowdown(t); f != 1 {
		d = max(time.Duration(float64(d)/f), 1)
	}
	e.busy = true
	e.stepStart, e.stepDur, e.stepEnd = t, d, t.Add(d)
	e.step = append(e.step[:0], e.running...)
	for _, s := range e.step {
		s.inStep = true
	}
	e.m.nDecode++
	e.m.nBusySlots += int64(len(e.running))
	if n := len(e.busyLog); n > 0 && e.busyLog[n-1].to.Equal(t) {
		e.busyLog[n-1].to = e.stepEnd
	} else {
		e.busyLog = append(e.busyLog, interval{t, e.stepEnd})
		if len(e.busyLog) > 4096 {
			e.pruneBusy(t.Add(-UtilWindow))
		}
	}
}

// pruneBusy drops busy intervals that ended before from.
func (e *Engine) pruneBusy(from time.Time) {
	keep := e.busyLog[:0]
	for _, iv := range e.busyLog {
		if iv.to.After(from) {
			keep = append(keep, iv)
		}
	}
	e.busyLog = keep
}

// StepTime returns the duration of one engine step that prefills
// prefillTokens and decodes one token for each of decoding sequences, with
// collision factor f (1 when alone):
//
//	(prefillTokens/PrefillTokensPerSec + [decoding>0](DecodeBase + DecodePerSeq*decoding)) * f / Speed
//
// A prefill and the decodes of a step run together, so a prefill stalls
// every decoding sequence in the batch.
func (e *Engine) StepTime(prefillTokens, decoding int, f float64) time.Duration {
	var d time.Duration
	if prefillTokens > 0 {
		d += time.Duration(float64(prefillTokens) / e.p.PrefillTokensPerSec * float64(time.Second))
	}
	if decoding > 0 {
		d += e.p.DecodeBase + e.p.DecodePerSeq*time.Duration(decoding)
	}
	if f != 1 {
		d = time.Duration(float64(d) * f)
	}
	if e.p.Speed != 1 {
		d = time.Duration(float64(d) / e.p.Speed)
	}
	return max(d, 1)
}

// finishStep delivers the tokens of the step that just ended, retires
// finished sequences, preempts on KV overflow and starts the next step.
func (e *Engine) finishStep() {
	t := e.stepEnd
	e.busy = false
	dur := e.stepDur
	for _, s := range e.step {
		s.inStep = false
		if s.state != stateRunning {
			continue // cancelled or preempted during the step
		}
		if s.prefill > 0 {
			if s.chunk == 0 {
				continue // waiting for room in the batch
			}
			e.m.promptTokens += int64(s.chunk)
			e.m.promptSeconds += dur.Seconds()
			s.res.PromptTime += dur
			s.prefill -= s.chunk
			s.chunk = 0
			if s.prefill > 0 {
				continue // more of the prompt in the next step
			}
			e.cachePrompt(s)
		} else {
			e.m.predictedSeconds += dur.Seconds()
			s.res.GenTime += dur
		}
		s.generated++
		s.kv++
		e.kvUsed++
		e.m.predictedTokens++
		e.m.nTokensMax = max(e.m.nTokensMax, s.kv)
		n := s.generated
		if n == 1 {
			s.res.FirstToken = t
			if s.cb.OnFirstToken != nil {
				f := s.cb.OnFirstToken
				e.emit(func() { f(t) })
			}
		}
		if s.cb.OnToken != nil {
			f := s.cb.OnToken
			e.emit(func() { f(t, n) })
		}
		if n >= s.target {
			e.finish(s, t, s.reason)
		}
	}
	e.step = e.step[:0]
	// The cliff: running sequences outgrew the cache. Preempt the most
	// recently admitted until the rest fit; it recomputes later.
	for e.kvUsed > e.p.KVTokens && len(e.running) > 0 {
		v := e.running[len(e.running)-1]
		if len(e.running) == 1 {
			// Alone and still too big: its context is full.
			e.finish(v, t, FinishLength)
			break
		}
		e.evict(v)
		v.state = stateQueued
		v.prefill = v.req.PromptTokens + v.generated
		v.res.Preempted++
		e.m.preemptions++
		e.queue = append([]*Seq{v}, e.queue...)
	}
	e.flush()
	e.maybeStart(t)
}

// finish retires a running sequence.
func (e *Engine) finish(s *Seq, t time.Time, reason string) {
	e.evict(s)
	s.state = stateDone
	s.res.FinishReason = reason
	s.res.CompletionTokens = s.generated
	s.res.Finished = t
	e.m.finished++
	if s.cb.OnDone != nil {
		f, res := s.cb.OnDone, s.res
		e.emit(func() { f(t, res) })
	}
}

func (e *Engine) emit(f func()) { e.pendingCB = append(e.pendingCB, f) }

// flush runs queued callbacks once the engine's state is consistent.
func (e *Engine) flush() {
	if e.inCallback {
		return // the outer flush will run them
	}
	e.inCallback = true
	defer func() { e.inCallback = false }()
	for i := 0; i < len(e.pendingCB); i++ {
		e.pendingCB[i]()
		e.pendingCB[i] = nil
	}
	e.pendingCB = e.pendingCB[:0]
}

// Metrics is a snapshot of the engine's gauges and counters.
type Metrics struct {
	// Time is the model time of the snapshot.
	Time time.Time
	// Ready is false while the model is loading.
	Ready bool
	// RequestsProcessing counts sequences holding a slot (llama.cpp's
	// requests_processing, equal to the busy slots).
	RequestsProcessing int
	// RequestsDeferred counts sequences waiting for a slot or KV room.
	RequestsDeferred int
	// TotalSlots is Params.Slots.
	TotalSlots int
	// KVCacheTokens is the number of tokens resident in the KV cache;
	// KVCacheCapacity its size and KVCacheUsageRatio their ratio (0..1).
	KVCacheTokens     int
	KVCacheCapacity   int
	KVCacheUsageRatio float64
	// Cumulative counters, as llama.cpp's /metrics: prompt tokens
	// prefilled (recomputations included) and the step time spent on them
	// summed per sequence; generated tokens and the decode time summed per
	// sequence.
	PromptTokensTotal     int64
	PromptSecondsTotal    float64
	PredictedTokensTotal  int64
	PredictedSecondsTotal float64
	// NDecodeTotal counts engine steps (llama_decode calls);
	// NBusySlotsTotal sums the busy slots over them.
	NDecodeTotal    int64
	NBusySlotsTotal int64
	// NTokensMax is the largest context any sequence reached.
	NTokensMax int
	// Preemptions, Finished and Cancelled count sequences' fates.
	Preemptions int64
	Finished    int64
	Cancelled   int64
	// CachedTokens counts prompt tokens found in the prefix cache and
	// not prefilled.
	CachedTokens int64
	// GPUUtilization is the fraction (0..1) of the last UtilWindow of model
	// time during which the engine was running a step.
	GPUUtilization float64
}

// UtilWindow is the look-back window of Metrics.GPUUtilization, about what
// NVML's utilisation sample period covers.
const UtilWindow = time.Second

// Metrics advances to now and returns a snapshot.
func (e *Engine) Metrics(now time.Time) Metrics {
	e.advance(now)
	now = e.now
	m := Metrics{
		Time:                  now,
		Ready:                 e.Ready(now),
		RequestsProcessing:    len(e.running),
		RequestsDeferred:      len(e.queue),
		TotalSlots:            e.p.Slots,
		KVCacheTokens:         e.kvUsed,
		KVCacheCapacity:       e.p.KVTokens,
		KVCacheUsageRatio:     float64(e.kvUsed) / float64(e.p.KVTokens),
		PromptTokensTotal:     e.m.promptTokens,
		PromptSecondsTotal:    e.m.promptSeconds,
		PredictedTokensTotal:  e.m.predictedTokens,
		PredictedSecondsTotal: e.m.predictedSeconds,
		NDecodeTotal:          e.m.nDecode,
		NBusySlotsTotal:       e.m.nBusySlots,
		NTokensMax:            e.m.nTokensMax,
		Preemptions:           e.m.preemptions,
		Finished:              e.m.finished,
		Cancelled:             e.m.cancelled,
		CachedTokens:          e.m.cachedTokens,
	}
	from := now.Add(-UtilWindow)
	e.pruneBusy(from)
	var busy time.Duration
	for _, iv := range e.busyLog {
		a, b := iv.from, iv.to
		if a.Before(from) {
			a = from
		}
		if b.After(now) {
			b = now
		}
		if b.After(a) {
			busy += b.Sub(a)
		}
	}
	m.GPUUtilization = float64(busy) / float64(UtilWindow)
	return m
}

// SlotState describes one slot for llama-server's GET /slots.
type SlotState struct {
	// ID is the slot's index; Busy whether a sequence holds it.
	ID   int
	Busy bool
	// SeqID, PromptTokens, Decoded and Remaining describe the occupant:
	// its id, prompt length, tokens generated and tokens still to come.
	SeqID        uint64
	PromptTokens int
	Decoded      int
	Remaining    int
	// Prompt is the Request.Text of the occupant, or of the slot's latest
	// one when it is free (llama-server reports the last task's prompt).
	Prompt string
}

// Slots advances to now and returns the state of every slot, by id.
func (e *Engine) Slots(now time.Time) []SlotState {
	e.advance(now)
	out := make([]SlotState, len(e.slots))
	for i, s := range e.slots {
		out[i].ID, out[i].Prompt = i, e.texts[i]
		if s != nil {
			out[i] = SlotState{ID: i, Busy: true, SeqID: s.id, PromptTokens: s.req.PromptTokens, Decoded: s.generated, Remaining: s.target - s.generated, Prompt: e.texts[i]}
		}
	}
	return out
}
