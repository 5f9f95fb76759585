package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testParams is DefaultParams with round numbers and no interference, so
// expected times can be computed exactly.
func testParams() Params {
	p := DefaultParams()
	p.PrefillTokensPerSec = 5000 // 0.2 ms per token
	p.DecodeBase = 10 * time.Millisecond
	p.DecodePerSeq = 1 * time.Millisecond
	p.InterferenceScale = 0
	return p
}

// drain runs the engine until it is idle and returns the final time.
func drain(e *Engine) time.Time {
	var last time.Time
	for {
		t, ok := e.NextEvent()
		if !ok {
			return last
		}
		e.AdvanceTo(t)
		last = t
	}
}

// probe records one sequence's callbacks.
type probe struct {
	first  time.Time
	tokens []time.Time
	ns     []int
	done   bool
	res    Result
}

func (p *probe) callbacks() Callbacks {
	return Callbacks{
		OnFirstToken: func(at time.Time) { p.first = at },
		OnToken: func(at time.Time, n int) {
			p.tokens = append(p.tokens, at)
			p.ns = append(p.ns, n)
		},
		OnDone: func(at time.Time, res Result) { p.done, p.res = true, res },
	}
}

func (p *probe) duration() time.Duration { return p.res.Finished.Sub(p.res.Submitted) }

func mustSubmit(t testing.TB, e *Engine, now time.Time, r Request, p *probe) *Seq {
	t.Helper()
	s, err := e.Submit(now, r, p.callbacks())
	if err != nil {
		t.Fatalf("Submit(%+v): %v", r, err)
	}
	return s
}

func TestEngine_AloneRunsAtConfiguredSpeed(t *testing.T) {
	tests := []struct {
		name           string
		speed          float64
		prompt, tokens int
		want           time.Duration
	}{
		// prefill 1000*0.2ms = 200ms, then 99 steps of 10ms+1ms.
		{"reference card", 1, 1000, 100, 200*time.Millisecond + 99*11*time.Millisecond},
		{"half speed card", 0.5, 1000, 100, 2 * (200*time.Millisecond + 99*11*time.Millisecond)},
		{"one token", 1, 50, 1, 10 * time.Millisecond},
		{"default interference is off when alone", 1, 10, 20, 2*time.Millisecond + 19*11*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testParams()
			p.Speed = tt.speed
			if tt.name == "default interference is off when alone" {
				p.InterferenceScale = DefaultParams().InterferenceScale
			}
			e := NewEngine(p, t0)
			var pr probe
			mustSubmit(t, e, t0, Request{PromptTokens: tt.prompt, MaxTokens: tt.tokens, IgnoreEOS: true}, &pr)
			drain(e)
			if !pr.done {
				t.Fatal("sequence did not finish")
			}
			if got := pr.duration(); got != tt.want {
				t.Fatalf("duration = %v, want %v", got, tt.want)
			}
			if got, want := pr.res.CompletionTokens, tt.tokens; got != want {
				t.Fatalf("completion tokens = %d, want %d", got, want)
			}
			if got, want := pr.res.FinishReason, FinishLength; got != want {
				t.Fatalf("finish reason = %q, want %q", got, want)
			}
			if got, want := pr.first, pr.tokens[0]; !got.Equal(want) {
				t.Fatalf("first token at %v, first OnToken at %v", got, want)
			}
		})
	}
}

func TestEngine_DefaultParamsSingleStreamRate(t *testing.T) {
	p := DefaultParams()
	e := NewEngine(p, t0)
	step := e.StepTime(0, 1, 1)
	if got, want := 1/step.Seconds(), 75.0; math.Abs(got-want) > 0.5 {
		t.Fatalf("single-stream decode = %.1f tokens/s, want about %.0f (A100 40GB measurement)", got, want)
	}
	if got, want := p.KVTokens, 32768; got != want {
		t.Fatalf("KVTokens = %d, want %d (4 GiB at 128 KiB/token)", got, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("DefaultParams do not validate: %v", err)
	}
}

func TestEngine_CollisionsAreSlowerAndVary(t *testing.T) {
	const prompt, tokens = 100, 200
	solo := func() time.Duration {
		e := NewEngine(testParams(), t0)
		var pr probe
		mustSubmit(t, e, t0, Request{PromptTokens: prompt, MaxTokens: tokens, IgnoreEOS: true}, &pr)
		drain(e)
		return pr.duration()
	}()
	var durations []time.Duration
	for seed := int64(1); seed <= 8; seed++ {
		p := testParams()
		p.InterferenceScale, p.InterferenceSigma = 0.1, 1
		p.Seed = seed
		e := NewEngine(p, t0)
		prs := make([]probe, 3)
		for i := range prs {
			// Staggered arrivals make the batch change several times.
			mustSubmit(t, e, t0.Add(time.Duration(i)*300*time.Millisecond), Request{PromptTokens: prompt, MaxTokens: tokens, IgnoreEOS: true}, &prs[i])
		}
		drain(e)
		for i := range prs {
			d := prs[i].duration()
			if d <= solo {
				t.Errorf("seed %d seq %d: %v together, not slower than %v alone", seed, i, d, solo)
			}
			durations = append(durations, d)
		}
	}
	slices.Sort(durations)
	if durations[0] == durations[len(durations)-1] {
		t.Fatalf("all collided durations equal (%v): no interference variation", durations[0])
	}
	// Heavy tail: the slowest collision run is far slower than the fastest,
	// more than the proportional batch cost alone would make it.
	if ratio := float64(durations[len(durations)-1]) / float64(durations[0]); ratio < 1.2 {
		t.Fatalf("slowest/fastest = %.2f, want a spread of at least 1.2", ratio)
	}
}

func TestEngine_InterferenceOnlyWhenColliding(t *testing.T) {
	p := testParams()
	p.InterferenceScale = 0.5
	e := NewEngine(p, t0)
	var a, b probe
	mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 50, IgnoreEOS: true}, &a)
	mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 50, IgnoreEOS: true}, &b)
	drain(e)
	// Without interference two together take 4ms prefill + 49 steps of 12ms.
	proportional := 4*time.Millisecond + 49*12*time.Millisecond
	if got := a.duration(); got <= proportional {
		t.Fatalf("colliding duration %v, want more than proportional %v", got, proportional)
	}
}

func TestEngine_PrefillStallsDecode(t *testing.T) {
	// A decodes alone (steps of 11ms after its 2ms prefill step); B
	// arrives mid-step with a 5000-token prompt (1s of prefill) and joins
	// the next step. A's 2nd token (step 2ms..13ms) precedes B's prefill.
	// Without a batch budget B's prompt runs in one step and A's next
	// token waits for all of it; with llama-server's default of 2048 the
	// batch holds A's token and 2047 of B's, so the same second of
	// prefill comes in three chunks (2047, 2047, 906 tokens) and A gets a
	// token after each.
	chunk := func(tokens int) time.Duration {
		return time.Duration(tokens)*200*time.Microsecond + 11*time.Millisecond
	}
	for _, tc := range []struct {
		name  string
		batch int
		gaps  []time.Duration // A's token gaps from its 2nd token on, while B prefills
	}{
		{"whole prompt in one step", 0, []time.Duration{chunk(5000)}},
		{"chunks of the batch budget", 2048, []time.Duration{chunk(2047), chunk(2047), chunk(906)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testParams()
			p.BatchTokens = tc.batch
			e := NewEngine(p, t0)
			var a, b probe
			mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 50, IgnoreEOS: true}, &a)
			arrive := t0.Add(2*time.Millisecond + 5*time.Millisecond)
			mustSubmit(t, e, arrive, Request{PromptTokens: 5000, MaxTokens: 5, IgnoreEOS: true}, &b)
			drain(e)
			var gaps []time.Duration
			for i := range tc.gaps {
				gaps = append(gaps, a.tokens[i+2].Sub(a.tokens[i+1]))
			}
			if diff := cmp.Diff(tc.gaps, gaps); diff != "" {
				t.Fatalf("A's token gaps over B's prefill (-want +got):\n%s", diff)
			}
			n := len(tc.gaps) + 1 // A's token that ends B's prefill
			if !b.first.Equal(a.tokens[n]) {
				t.Fatalf("B's first token at %v, want with A's token %d at %v", b.first, n+1, a.tokens[n])
			}
			// Afterwards both decode together: 10ms + 2*1ms.
			if got, want := a.tokens[n+1].Sub(a.tokens[n]), 12*time.Millisecond; got != want {
				t.Fatalf("A's gap decoding with B = %v, want %v", got, want)
			}
			if got, want := b.res.PromptTime, sum(tc.gaps); got != want {
				t.Fatalf("B's prompt time = %v, want the steps that prefilled it, %v", got, want)
			}
		})
	}
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

func TestEngine_SlotQueueIsFIFO(t *testing.T) {
	p := testParams()
	p.Slots = 2
	e := NewEngine(p, t0)
	prs := make([]probe, 5)
	for i := range prs {
		mustSubmit(t, e, t0.Add(time.Duration(i)*time.Microsecond), Request{PromptTokens: 10, MaxTokens: 20 + 5*i, IgnoreEOS: true}, &prs[i])
	}
	m := e.Metrics(t0.Add(time.Millisecond))
	if got, want := [2]int{m.RequestsProcessing, m.RequestsDeferred}, [2]int{2, 3}; got != want {
		t.Fatalf("processing, deferred = %v, want %v", got, want)
	}
	drain(e)
	var firsts []time.Time
	for i := range prs {
		if !prs[i].done {
			t.Fatalf("seq %d did not finish", i)
		}
		firsts = append(firsts, prs[i].first)
	}
	if !slices.IsSortedFunc(firsts, func(a, b time.Time) int { return a.Compare(b) }) {
		t.Fatalf("first tokens out of arrival order: %v", firsts)
	}
	// The third request starts only when the first frees its slot.
	if !prs[2].first.After(prs[0].res.Finished) {
		t.Fatalf("deferred request started at %v before a slot freed at %v", prs[2].first, prs[0].res.Finished)
	}
	m = e.Metrics(drainTime(e))
	if got, want := [2]int{m.RequestsProcessing, m.RequestsDeferred}, [2]int{0, 0}; got != want {
		t.Fatalf("after drain processing, deferred = %v, want %v", got, want)
	}
}

func drainTime(e *Engine) time.Time { return e.now }

func TestEngine_KVCliffPreemptsAndDelays(t *testing.T) {
	run := func(kv int) (a, b probe, m Metrics) {
		p := testParams()
		p.KVTokens = kv
		e := NewEngine(p, t0)
		mustSubmit(t, e, t0, Request{PromptTokens: 100, MaxTokens: 300, IgnoreEOS: true}, &a)
		mustSubmit(t, e, t0.Add(time.Microsecond), Request{PromptTokens: 100, MaxTokens: 300, IgnoreEOS: true}, &b)
		drain(e)
		return a, b, e.Metrics(e.now)
	}
	_, roomyB, roomy := run(10000)
	a, b, tight := run(600) // both need 400 at the end: 800 > 600
	if roomy.Preemptions != 0 {
		t.Fatalf("roomy cache preempted %d times", roomy.Preemptions)
	}
	if b.res.Preempted == 0 || tight.Preemptions == 0 {
		t.Fatalf("tight cache: b preempted %d times, engine %d; want the cliff", b.res.Preempted, tight.Preemptions)
	}
	if a.res.Preempted != 0 {
		t.Fatalf("the earlier admitted sequence was preempted %d times, want the latest", a.res.Preempted)
	}
	if !b.res.Finished.After(roomyB.res.Finished) {
		t.Fatalf("preempted finish %v not later than unpreempted %v", b.res.Finished, roomyB.res.Finished)
	}
	// Tokens are delivered once each, in order, despite the recompute.
	if got, want := len(b.ns), 300; got != want {
		t.Fatalf("b got %d token callbacks, want %d", got, want)
	}
	for i, n := range b.ns {
		if n != i+1 {
			t.Fatalf("token callback %d reported n=%d", i, n)
		}
	}
	// The recompute prefilled prompt+generated again.
	if tight.PromptTokensTotal <= roomy.PromptTokensTotal {
		t.Fatalf("prompt tokens with recompute %d, without %d", tight.PromptTokensTotal, roomy.PromptTokensTotal)
	}
	if tight.KVCacheTokens != 0 {
		t.Fatalf("KV not empty after drain: %d", tight.KVCacheTokens)
	}
}

func TestEngine_AloneTooLongForCacheStopsAtLength(t *testing.T) {
	p := testParams()
	p.KVTokens = 200
	e := NewEngine(p, t0)
	var a probe
	mustSubmit(t, e, t0, Request{PromptTokens: 150, MaxTokens: 500, IgnoreEOS: true}, &a)
	drain(e)
	if got, want := a.res.CompletionTokens, 51; got != want {
		t.Fatalf("completion tokens = %d, want %d (context full)", got, want)
	}
	if a.res.FinishReason != FinishLength {
		t.Fatalf("finish reason %q, want %q", a.res.FinishReason, FinishLength)
	}
	if _, err := e.Submit(e.now, Request{PromptTokens: 200}, Callbacks{}); !errors.Is(err, ErrContextExceeded) {
		t.Fatalf("oversized prompt: err = %v, want ErrContextExceeded", err)
	}
}

func TestEngine_CancelFreesSlotAndKV(t *testing.T) {
	p := testParams()
	p.Slots = 1
	e := NewEngine(p, t0)
	var a, b probe
	sa := mustSubmit(t, e, t0, Request{PromptTokens: 100, MaxTokens: 1000, IgnoreEOS: true}, &a)
	mustSubmit(t, e, t0, Request{PromptTokens: 50, MaxTokens: 10, IgnoreEOS: true}, &b)
	now := t0.Add(100 * time.Millisecond)
	m := e.Metrics(now)
	if m.RequestsProcessing != 1 || m.RequestsDeferred != 1 || m.KVCacheTokens <= 100 {
		t.Fatalf("before cancel: %+v", m)
	}
	e.Cancel(now, sa)
	if !a.done || !a.res.Cancelled {
		t.Fatalf("cancelled sequence result = %+v", a.res)
	}
	m = e.Metrics(now)
	if got, want := [3]int{m.RequestsProcessing, m.RequestsDeferred, m.KVCacheTokens}, [3]int{1, 0, 50}; got != want {
		t.Fatalf("after cancel processing, deferred, kv = %v, want %v", got, want)
	}
	drain(e)
	if !b.done || b.res.Cancelled || b.res.CompletionTokens != 10 {
		t.Fatalf("queued request after cancel: %+v", b.res)
	}
	if !b.first.After(now) || b.first.After(now.Add(20*time.Millisecond)) {
		t.Fatalf("queued request first token at %v, want just after the cancel at %v", b.first, now)
	}
	n := len(a.tokens)
	e.Cancel(e.now, sa) // cancelling twice is harmless
	if len(a.tokens) != n || e.Metrics(e.now).Cancelled != 1 {
		t.Fatal("second cancel had an effect")
	}
}

func TestEngine_CancelQueued(t *testing.T) {
	p := testParams()
	p.Slots = 1
	e := NewEngine(p, t0)
	var a, b probe
	mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 10, IgnoreEOS: true}, &a)
	sb := mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 10, IgnoreEOS: true}, &b)
	e.Cancel(t0, sb)
	if got := e.Metrics(t0).RequestsDeferred; got != 0 {
		t.Fatalf("deferred after cancelling the queued one = %d", got)
	}
	drain(e)
	if len(b.tokens) != 0 || !b.res.Cancelled {
		t.Fatalf("cancelled queued request produced %d tokens, result %+v", len(b.tokens), b.res)
	}
}

// eventLog runs a fixed workload and returns a printable trace of it.
func eventLog(seed int64) []string {
	p := DefaultParams()
	p.Seed = seed
	p.Slots = 3
	p.KVTokens = 1500
	e := NewEngine(p, t0)
	var log []string
	for i := range 12 {
		i := i
		_, err := e.Submit(t0.Add(time.Duration(i)*40*time.Millisecond), Request{PromptTokens: 50 + 37*i}, Callbacks{
			OnFirstToken: func(at time.Time) { log = append(log, fmt.Sprintf("%d first %v", i, at.Sub(t0))) },
			OnDone: func(at time.Time, r Result) {
				log = append(log, fmt.Sprintf("%d done %v %d %s %d", i, at.Sub(t0), r.CompletionTokens, r.FinishReason, r.Preempted))
			},
		})
		if err != nil {
			panic(err)
		}
	}
	drain(e)
	return log
}

func TestEngine_DeterministicWithSeed(t *testing.T) {
	a, b := eventLog(7), eventLog(7)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed, different runs (-first +second):\n%s", diff)
	}
	if len(a) != 24 {
		t.Fatalf("got %d events, want 24", len(a))
	}
	if cmp.Equal(a, eventLog(8)) {
		t.Fatal("different seeds gave identical runs")
	}
}

func TestEngine_OutputLengths(t *testing.T) {
	p := DefaultParams()
	e := NewEngine(p, t0)
	var lens []int
	for range 4000 {
		s, err := e.Submit(t0, Request{PromptTokens: 1}, Callbacks{})
		if err != nil {
			t.Fatal(err)
		}
		lens = append(lens, s.Target())
	}
	slices.Sort(lens)
	if lens[0] < p.OutputMin || lens[len(lens)-1] > p.OutputMax {
		t.Fatalf("lengths outside [%d, %d]: %d..%d", p.OutputMin, p.OutputMax, lens[0], lens[len(lens)-1])
	}
	if med := lens[len(lens)/2]; med < 160 || med > 200 {
		t.Fatalf("median output %d, want about %v", med, p.OutputMedian)
	}
	if p99 := lens[len(lens)*99/100]; p99 < 1200 {
		t.Fatalf("p99 output %d, want a heavy tail (about 1840)", p99)
	}
	tests := []struct {
		req        Request
		want       int
		wantReason string
	}{
		{Request{PromptTokens: 5, MaxTokens: 77, IgnoreEOS: true}, 77, FinishLength},
		{Request{PromptTokens: 5, IgnoreEOS: true}, p.OutputMax, FinishLength},
		{Request{PromptTokens: 5, MaxTokens: 3}, 3, FinishLength},
	}
	for _, tt := range tests {
		s, err := e.Submit(t0, tt.req, Callbacks{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Target() != tt.want || s.reason != tt.wantReason {
			t.Errorf("%+v: target %d %q, want %d %q", tt.req, s.Target(), s.reason, tt.want, tt.wantReason)
		}
	}
}

func TestEngine_StartupDelay(t *testing.T) {
	p := testParams()
	p.StartupDelay = 30 * time.Second
	e := NewEngine(p, t0)
	if e.Ready(t0.Add(29 * time.Second)) {
		t.Fatal("ready during startup delay")
	}
	var a probe
	mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 2, IgnoreEOS: true}, &a)
	if next, ok := e.NextEvent(); !ok || !next.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("NextEvent = %v %v, want the end of loading", next, ok)
	}
	drain(e)
	if want := t0.Add(30*time.Second + 2*time.Millisecond); !a.first.Equal(want) {
		t.Fatalf("first token at %v, want %v", a.first.Sub(t0), want.Sub(t0))
	}
	if !e.Ready(t0.Add(30 * time.Second)) {
		t.Fatal("not ready after startup delay")
	}
}

func TestEngine_GPUUtilization(t *testing.T) {
	e := NewEngine(testParams(), t0)
	if u := e.Metrics(t0).GPUUtilization; u != 0 {
		t.Fatalf("idle utilisation %v", u)
	}
	var a probe
	mustSubmit(t, e, t0, Request{PromptTokens: 10, MaxTokens: 1000, IgnoreEOS: true}, &a)
	if u := e.Metrics(t0.Add(2 * time.Second)).GPUUtilization; math.Abs(u-1) > 1e-9 {
		t.Fatalf("busy utilisation %v, want 1", u)
	}
	end := drain(e)
	if u := e.Metrics(end.Add(500 * time.Millisecond)).GPUUtilization; math.Abs(u-0.5) > 1e-9 {
		t.Fatalf("utilisation half a second after finishing %v, want 0.5", u)
	}
	m := e.Metrics(end.Add(time.Hour))
	if m.GPUUtilization != 0 || m.NDecodeTotal != 1000 || m.NBusySlotsTotal != 1000 {
		t.Fatalf("after an hour idle: %+v", m)
	}
}

func TestEngine_CallbackMaySubmit(t *testing.T) {
	e := NewEngine(testParams(), t0)
	var second probe
	_, err := e.Submit(t0, Request{PromptTokens: 10, MaxTokens: 3, IgnoreEOS: true}, Callbacks{
		OnDone: func(at time.Time, _ Result) {
			mustSubmit(t, e, at, Request{PromptTokens: 10, MaxTokens: 3, IgnoreEOS: true}, &second)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	drain(e)
	if !second.done || second.res.CompletionTokens != 3 {
		t.Fatalf("follow-up submitted from OnDone: %+v", second.res)
	}
}

func TestParams_ValidateReportsEveryProblem(t *testing.T) {
	p := Params{}
	err := p.Validate()
	if err == nil {
		t.Fatal("zero Params validated")
	}
	for _, key := range []string{"model", "slots", "kv_tokens", "prefill_tokens_per_sec", "decode_base", "speed", "output_median", "output_min"} {
		if !contains(err.Error(), key+":") {
			t.Errorf("error does not mention %s: %v", key, err)
		}
	}
}

func TestParams_BatchTokens(t *testing.T) {
	for _, tc := range []struct {
		batch int
		ok    bool
	}{{0, true}, {2048, true}, {5, true}, {4, false}, {-1, false}} {
		p := DefaultParams() // 4 slots
		p.BatchTokens = tc.batch
		err := p.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("batch_tokens %d: Validate() = %v, want ok %v", tc.batch, err, tc.ok)
		}
		if err != nil && !contains(err.Error(), "batch_tokens:") {
			t.Errorf("batch_tokens %d: error does not name the field: %v", tc.batch, err)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// BenchmarkEngine_Step measures one engine step with a full batch of four
// decoding sequences, the simulator's inner loop.
func BenchmarkEngine_Step(b *testing.B) {
	p := DefaultParams()
	p.KVTokens = 1 << 30
	e := NewEngine(p, t0)
	for range p.Slots {
		if _, err := e.Submit(t0, Request{PromptTokens: 100, MaxTokens: 1 << 30, IgnoreEOS: true}, Callbacks{OnToken: func(time.Time, int) {}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t, _ := e.NextEvent()
		e.AdvanceTo(t)
	}
}

// BenchmarkEngine_Request measures a whole short request through a busy
// engine: submit, prefill, 50 decode steps shared with others, done.
func BenchmarkEngine_Request(b *testing.B) {
	p := DefaultParams()
	e := NewEngine(p, t0)
	now := t0
	b.ReportAllocs()
	for range b.N {
		if _, err := e.Submit(now, Request{PromptTokens: 100, MaxTokens: 50, IgnoreEOS: true}, Callbacks{}); err != nil {
			b.Fatal(err)
		}
		if e.Metrics(now).RequestsDeferred > 8 {
			now = drain(e)
		}
	}
	drain(e)
}

func TestEngine_SlowdownStretchesStepsInItsWindow(t *testing.T) {
	p := DefaultParams()
	p.InterferenceScale = 0
	p.Slowdowns = []Slowdown{{After: 10 * time.Second, For: 10 * time.Second, Factor: 0.5}}
	start := time.Unix(0, 0)
	run := func(at time.Duration) time.Duration {
		e := NewEngine(p, start)
		var first, done time.Time
		if _, err := e.Submit(start.Add(at), Request{PromptTokens: 1, MaxTokens: 11, IgnoreEOS: true}, Callbacks{
			OnFirstToken: func(t time.Time) { first = t },
			OnDone:       func(t time.Time, _ Result) { done = t },
		}); err != nil {
			t.Fatal(err)
		}
		e.AdvanceTo(start.Add(time.Hour))
		return done.Sub(first)
	}
	before, during, after := run(0), run(12*time.Second), run(30*time.Second)
	if before != after {
		t.Fatalf("decode of 10 tokens took %v before and %v after the slowdown", before, after)
	}
	if got, want := during, 2*before; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("during the slowdown it took %v, want about %v (half speed)", got, want)
	}
}
