package vsim

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// fleetOf returns n reference workers with no startup delay.
func fleetOf(n int, edit func(*sim.Params)) []sim.WorkerSpec {
	out := make([]sim.WorkerSpec, n)
	for i := range out {
		p := sim.DefaultParams()
		p.Seed = int64(i + 1)
		if edit != nil {
			edit(&p)
		}
		out[i] = sim.WorkerSpec{Name: "w" + string(rune('0'+i)), Params: p}
	}
	return out
}

func synth(t *testing.T, rate float64, n int, seed uint64) []bench.Item {
	t.Helper()
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: rate}, Count: n, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return items
}

func mustRun(t *testing.T, cfg Config, items []bench.Item) []bench.Result {
	t.Helper()
	res, err := Run(cfg, items)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(res), len(items); got != want {
		t.Fatalf("%d results for %d items", got, want)
	}
	return res
}

func TestRun_DeterministicBySeed(t *testing.T) {
	items := synth(t, 3, 300, 7)
	for _, p := range []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyRandom} {
		cfg := DefaultConfig(sim.DemoFleet())
		cfg.Policy, cfg.Seed = p, 42
		a, b := mustRun(t, cfg, items), mustRun(t, cfg, items)
		if d := cmp.Diff(a, b); d != "" {
			t.Fatalf("%s: two runs with the same seed differ (-a +b):\n%s", p, d)
		}
	}
	cfg := DefaultConfig(sim.DemoFleet())
	cfg.Policy = scheduler.PolicyRandom
	cfg.Seed = 1
	a := mustRun(t, cfg, items)
	cfg.Seed = 2
	if b := mustRun(t, cfg, items); cmp.Equal(a, b) {
		t.Fatal("random policy with seeds 1 and 2 gave identical runs: the seed is not used")
	}
}

func TestRun_SingleRequestMatchesEngine(t *testing.T) {
	for _, ws := range sim.DemoFleet() {
		cfg := DefaultConfig([]sim.WorkerSpec{ws})
		const prompt, out = 1500, 120
		res := mustRun(t, cfg, []bench.Item{{At: 3 * time.Second, PromptTokens: prompt, OutputTokens: out, Row: 1}})[0]
		p := ws.Params
		// Alone: prompt/PrefillTokensPerSec + (n-1)·(DecodeBase+DecodePerSeq), over Speed.
		eng := sim.NewEngine(p, Epoch)
		wantTTFT := eng.StepTime(prompt, 0, 1)
		wantE2E := wantTTFT + time.Duration(out-1)*eng.StepTime(0, 1, 1)
		if !res.OK() || res.Worker != ws.Name {
			t.Fatalf("%s: result %+v", ws.Name, res)
		}
		if res.TTFT != wantTTFT || res.E2E != wantE2E || res.OutputTokens != out {
			t.Fatalf("%s: TTFT %v E2E %v tokens %d, want exactly %v, %v, %d", ws.Name, res.TTFT, res.E2E, res.OutputTokens, wantTTFT, wantE2E, out)
		}
	}
}

func TestRun_FourBurstAtFourIdleLandsOnePerWorker(t *testing.T) {
	cfg := DefaultConfig(fleetOf(4, nil))
	items := make([]bench.Item, 4)
	for i := range items {
		items[i] = bench.Item{At: 0, PromptTokens: 500, OutputTokens: 50, Row: i + 1}
	}
	res := mustRun(t, cfg, items)
	var workers []string
	for _, r := range res {
		workers = append(workers, r.Worker)
	}
	slices.Sort(workers)
	if got, want := workers, []string{"w0", "w1", "w2", "w3"}; !slices.Equal(got, want) {
		t.Fatalf("workers %v, want one request on each of %v", got, want)
	}
}

// oneSlot is a single worker that Sluice gives one request at a time.
func oneSlot() Config {
	cfg := DefaultConfig(fleetOf(1, nil))
	cfg.MaxConcurrency = 1
	return cfg
}

func TestRun_QueueTimeoutFiresAtTheRightVirtualTime(t *testing.T) {
	cfg := oneSlot()
	cfg.QueueTimeout = 5 * time.Second
	items := []bench.Item{
		{At: 0, PromptTokens: 100, OutputTokens: 1000, Row: 1}, // ~13 s alone
		{At: 2 * time.Second, PromptTokens: 100, OutputTokens: 10, Row: 2},
	}
	res := mustRun(t, cfg, items)
	if !res[0].OK() {
		t.Fatalf("first request failed: %+v", res[0])
	}
	r := res[1]
	if r.Kind != bench.KindRefused || r.Status != http.StatusServiceUnavailable || r.Reason != "queue_timeout" {
		t.Fatalf("second request: %+v, want 503 queue_timeout", r)
	}
	if got, want := r.E2E, 5*time.Second; got != want {
		t.Fatalf("timed out after %v, want exactly %v", got, want)
	}
	if got, want := r.QueueMs, 5000.0; got != want {
		t.Fatalf("queue wait %vms, want %vms", got, want)
	}
}

func TestRun_RefusalsCounted(t *testing.T) {
	cfg := oneSlot()
	cfg.MaxQueue = 1
	items := []bench.Item{
		{At: 0, PromptTokens: 100, OutputTokens: 100, Row: 1},
		{At: time.Millisecond, PromptTokens: 100, OutputTokens: 100, Row: 2}, // queued
		{At: 2 * time.Millisecond, PromptTokens: 100, OutputTokens: 100, Row: 3},
		{At: 3 * time.Millisecond, PromptTokens: 100, OutputTokens: 100, Row: 4},
	}
	s := bench.Summarize(mustRun(t, cfg, items), bench.SLO{})
	if got, want := s.OK, 2; got != want {
		t.Fatalf("ok %d, want %d (%+v)", got, want, s)
	}
	if got, want := s.Refusals["queue_full"], 2; got != want {
		t.Fatalf("queue_full refusals %d, want %d (%v)", got, want, s.ErrorsByKind)
	}
	if got, want := s.ErrorsByKind["refused 429"], 2; got != want {
		t.Fatalf("429s %d, want %d (%v)", got, want, s.ErrorsByKind)
	}
}

func TestRun_NoWorkerServesModel(t *testing.T) {
	cfg := DefaultConfig(fleetOf(1, nil))
	cfg.Model = "other"
	r := mustRun(t, cfg, []bench.Item{{PromptTokens: 10, OutputTokens: 10}})[0]
	if r.Status != http.StatusNotFound || r.Reason != "model_not_found" {
		t.Fatalf("result %+v, want 404 model_not_found", r)
	}
}

func TestRun_BacklogDrainsInArrivalOrder(t *testing.T) {
	cfg := DefaultConfig(fleetOf(2, nil))
	cfg.MaxConcurrency = 1
	var items []bench.Item
	for i := range 30 {
		items = append(items, bench.Item{At: time.Duration(i) * 10 * time.Millisecond, PromptTokens: 200 + 37*i%300, OutputTokens: 20 + 13*i%50, Row: i + 1})
	}
	res := mustRun(t, cfg, items)
	queued := 0
	var lastBind time.Duration
	for _, r := range res {
		if !r.OK() {
			t.Fatalf("request failed: %+v", r)
		}
		if r.QueueMs > 0 {
			queued++
		}
		bind := r.Scheduled + time.Duration(r.QueueMs*float64(time.Millisecond))
		if bind < lastBind {
			t.Fatalf("row %d bound at %v, before an earlier arrival bound at %v", r.Row, bind, lastBind)
		}
		lastBind = bind
	}
	if queued < 20 {
		t.Fatalf("only %d requests queued; the test needs a backlog", queued)
	}
	if n := FIFOInversions(res, 0); n != 0 {
		t.Fatalf("%d FIFO inversions", n)
	}
}

func TestParseDecisions_ReplaysFirstAttempts(t *testing.T) {
	log := strings.Join([]string{
		`{"id":"a-1","time":"2025-03-01T10:00:00Z","model":"m","policy":"sluice","attempt":1,"prompt_tokens":100,"max_tokens":20,"queue_wait_ms":0,"outcome":"bound","candidates":[]}`,
		`{"id":"a-2","time":"2025-03-01T10:00:02.5Z","model":"m","policy":"sluice","attempt":1,"prompt_tokens":300,"queue_wait_ms":500,"outcome":"bound","candidates":[]}`,
		`{"id":"a-1","ttft_ms":40,"worker_ttft_ms":40}`, // a-1's first token, logged when its request ended
		`{"id":"a-3","time":"2025-03-01T10:00:03Z","model":"m","policy":"sluice","attempt":2,"prompt_tokens":300,"max_tokens":40,"queue_wait_ms":0,"outcome":"bound","candidates":[]}`,
		``,
		`{"id":"a-4","time":"2025-03-01T10:00:01Z","model":"m","policy":"sluice","attempt":1,"prompt_tokens":50,"max_tokens":5,"queue_wait_ms":0,"outcome":"queue_full","candidates":[]}`,
	}, "\n")
	items, err := ParseDecisions(strings.NewReader(log), "log.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []bench.Item{
		{At: 0, PromptTokens: 100, OutputTokens: 20, Row: 1},
		{At: time.Second, PromptTokens: 50, OutputTokens: 5, Row: 6},
		{At: 2 * time.Second, PromptTokens: 300, OutputTokens: DefaultReplayOutput, Row: 2},
	}
	if d := cmp.Diff(want, items); d != "" {
		t.Fatalf("items (-want +got):\n%s", d)
	}
	if !isDecisionLog([]byte(log)) {
		t.Fatal("the log is not recognised as a decision log")
	}
	if isDecisionLog([]byte(`{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": []}`)) {
		t.Fatal("a Mooncake line is taken for a decision log")
	}
	cfg := DefaultConfig(fleetOf(1, nil))
	cfg.Policy = scheduler.PolicyRoundRobin
	res := mustRun(t, cfg, items)
	for _, r := range res {
		if !r.OK() || r.OutputTokens != r.MaxTokens {
			t.Fatalf("replayed request %+v", r)
		}
	}
	if _, err := ParseDecisions(strings.NewReader("{not json"), "bad.jsonl"); err == nil || !strings.Contains(err.Error(), "bad.jsonl:1") {
		t.Fatalf("error %v, want one naming bad.jsonl:1", err)
	}
}

func TestBurstAndAtRate(t *testing.T) {
	items := make([]bench.Item, 101)
	for i := range items {
		items[i] = bench.Item{At: time.Duration(i) * time.Second, Row: i + 1}
	}
	fast, err := AtRate(items, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fast[100].At, 25*time.Second; got != want {
		t.Fatalf("last arrival at %v, want %v", got, want)
	}
	b := Burst(items, 10*time.Second, 5*time.Second, 4)
	// Arrivals 10..29 s are squeezed into 10..15 s; 30 s moves to 15 s.
	if got, want := b[30].At, 15*time.Second; got != want {
		t.Fatalf("first arrival after the burst at %v, want %v", got, want)
	}
	in := 0
	for _, it := range b {
		if it.At >= 10*time.Second && it.At < 15*time.Second {
			in++
		}
	}
	if got, want := in, 20; got != want {
		t.Fatalf("%d arrivals in the burst window, want %d", got, want)
	}
}

func TestCapacity_ScalesWithSpeedAndSlots(t *testing.T) {
	p := sim.DefaultParams()
	base := WorkerCapacity(p, 1000, 200)
	p.Speed = 2
	if got := WorkerCapacity(p, 1000, 200); got < 1.99*base || got > 2.01*base {
		t.Fatalf("capacity at speed 2 is %v, want twice %v", got, base)
	}
	// Sustainable: at 90% of the estimate the fleet keeps up, at 200% it
	// does not.
	items := synth(t, 1, 400, 3)
	capacity := Capacity(fleetOf(2, nil), items)
	for _, c := range []struct {
		frac     float64
		keepesUp bool
	}{{0.9, true}, {2, false}} {
		load, err := AtRate(items, c.frac*capacity)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig(fleetOf(2, nil))
		// The estimate is of every slot busy: hold the limits there (the
		// learned limits trade some of that capacity for decode rate).
		cfg.Concurrency.Fixed = true
		s := bench.Summarize(mustRun(t, cfg, load), bench.SLO{})
		keeps := s.Errors == 0 && s.TTFT.P50 < 2000
		if keeps != c.keepesUp {
			t.Fatalf("at %.0f%% of the estimated %.2f req/s: errors %d, p50 TTFT %.0fms", 100*c.frac, capacity, s.Errors, s.TTFT.P50)
		}
	}
}

func TestPlan_FindsSmallestFleet(t *testing.T) {
	items := synth(t, 2, 200, 5)
	pc := PlanConfig{Router: DefaultConfig(nil), Card: sim.DefaultParams(), Items: items, TargetP99TTFT: 3 * time.Second, MaxWorkers: 64}
	res, err := Plan(pc)
	if err != nil {
		t.Fatal(err)
	}
	if res.Workers == 0 {
		t.Fatalf("no fleet up to 64 meets the goal: %+v", res.Steps)
	}
	for _, s := range res.Steps {
		if s.Workers < res.Workers && s.Met {
			t.Fatalf("%d workers met the goal but the answer is %d", s.Workers, res.Workers)
		}
		if s.Workers == res.Workers && !s.Met {
			t.Fatalf("the answer %d did not meet the goal", res.Workers)
		}
	}
	if res.Workers > 1 {
		found := false
		for _, s := range res.Steps {
			found = found || (s.Workers == res.Workers-1 && !s.Met)
		}
		if !found {
			t.Fatalf("one fewer than %d workers was not shown to fail: %+v", res.Workers, res.Steps)
		}
	}
}
