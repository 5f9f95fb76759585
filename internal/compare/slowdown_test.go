package compare

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// slowFleet is four reference cards, "slow" at half speed from 60 s to
// 120 s after creation, every card loading for 2 s.
func slowFleet() []sim.WorkerSpec {
	var fleet []sim.WorkerSpec
	for _, name := range []string{"a", "slow", "b", "c"} {
		p := sim.DefaultParams()
		p.StartupDelay = 2 * time.Second
		if name == "slow" {
			p.Slowdowns = []sim.Slowdown{{After: 62 * time.Second, For: time.Minute, Factor: 0.5}}
		}
		fleet = append(fleet, sim.WorkerSpec{Name: name, Params: p})
	}
	return fleet
}

// routedRun sends a request every 100 ms for 200 s, in turn to the four
// cards, except that the slowed card is skipped from avoidFrom to
// avoidTo (offsets of the run).
func routedRun(avoidFrom, avoidTo time.Duration) []bench.Result {
	names := []string{"a", "slow", "b", "c"}
	var res []bench.Result
	for i := range 2000 {
		at := time.Duration(i) * 100 * time.Millisecond
		w := names[i%4]
		if w == "slow" && at >= avoidFrom && at < avoidTo {
			w = "a"
		}
		res = append(res, bench.Result{Start: at, Worker: w, TTFT: 100 * time.Millisecond, QueueMs: -1})
	}
	return res
}

func TestJudgeSpell_TimesTheTurnAwayAndTheReturn(t *testing.T) {
	sp := spellsOf(slowFleet())
	if len(sp) != 1 || sp[0].from != time.Minute || sp[0].to != 2*time.Minute || sp[0].worker != "slow" {
		t.Fatalf("spells %+v, want one on slow from 1m to 2m of the run (startup counted off)", sp)
	}
	// Avoided from 6 s into the slowdown to 17 s after it: the first 5 s
	// window that sends the card less than the threshold (halfway from a
	// quarter to a seventh) is the one 3 s in, which holds 3 s of the
	// avoidance; the first that sends it as much is the one from 16 s.
	j := judgeSpell(bench.NamedRun{Name: "r", Results: routedRun(66*time.Second, 137*time.Second)}, sp[0])
	if !j.routedOK || j.routed != 3*time.Second {
		t.Errorf("routed around after %v (ok %v), want 3s", j.routed, j.routedOK)
	}
	if !j.backOK || j.back != 16*time.Second {
		t.Errorf("back after %v (ok %v), want 16s", j.back, j.backOK)
	}
	if j.before != 0.25 {
		t.Errorf("share before %v, want 0.25", j.before)
	}
	// A router that never turns away: the card keeps its share.
	j = judgeSpell(bench.NamedRun{Name: "r", Results: routedRun(0, 0)}, sp[0])
	if j.routedOK {
		t.Errorf("a run that never avoids the card was routed around after %v", j.routed)
	}
	if !j.backOK || j.back != 0 {
		t.Errorf("a run that never left the card was back after %v (ok %v), want 0", j.back, j.backOK)
	}
}

func TestWriteSlowdowns_ReportsOnlyFleetsWithASlowdown(t *testing.T) {
	runs := []bench.NamedRun{{Name: "sluice", Results: routedRun(64*time.Second, 2*time.Minute)}, {Name: "least-connections", Results: routedRun(0, 0)}}
	var md bytes.Buffer
	if err := writeSlowdowns(&md, Options{}, slowFleet(), runs, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slowing card: slow at ×0.5", "routed around within 5s of the start: 1 s — met", "back within 30s of the end: 0 s — met"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	md.Reset()
	if err := writeSlowdowns(&md, Options{}, sim.DemoFleet(), runs, nil); err != nil {
		t.Fatal(err)
	}
	if md.Len() != 0 {
		t.Errorf("a fleet without slowdowns got a report:\n%s", md.String())
	}
}

// TestRecordSpell_SeesTheCardsDecodeRateFall replays a virtual Sluice run
// on slowFleet and checks that its records show the slowed card's
// measured decode rate fall while it is slow, and every phase decided.
func TestRecordSpell_SeesTheCardsDecodeRateFall(t *testing.T) {
	items, err := bench.Synthesize(bench.Synthetic{Arrivals: bench.Arrivals{Rate: 1.5}, Count: 300, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sp := spellsOf(slowFleet())[0]
	st, err := recordSpell(Options{Seed: 1}, slowFleet(), items, sp)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range st.decisions {
		if n == 0 {
			t.Fatalf("no decisions in phase %d: %+v", i, st.decisions)
		}
	}
	g := st.terms["throughput"]
	if g == nil {
		t.Fatalf("no throughput term in the records: %v", st.order)
	}
	before, during := meanOf(g.raw[0], g.n[0]), meanOf(g.raw[1], g.n[1])
	if !(during < 0.8*before) {
		t.Errorf("the slowed card's decode-rate average %.1f tok/s before, %.1f while slow: want a clear fall", before, during)
	}
	var md bytes.Buffer
	writeSpellTerms(&md, st, sp)
	if !strings.Contains(md.String(), "| throughput |") || !strings.Contains(md.String(), "moved most against the card") {
		t.Errorf("report:\n%s", md.String())
	}
}

func TestWithSpell_SetsTheSlowingCardsFigures(t *testing.T) {
	runs := []bench.NamedRun{{Name: "sluice", Results: routedRun(64*time.Second, 2*time.Minute)}, {Name: "least-connections", Results: routedRun(0, 0)}}
	r := withSpell(ratios{}, slowFleet(), runs)
	if !r.slowing || r.routed != 1 || r.back != 0 || r.slowP99 != 1 {
		t.Errorf("got %+v, want slowing, routed around after 1 s, back after 0 s, p99 ratio 1", r)
	}
	if r := withSpell(ratios{}, sim.DemoFleet(), runs); r.slowing {
		t.Errorf("a fleet without slowdowns got slowing-card figures: %+v", r)
	}
	never := withSpell(ratios{}, slowFleet(), []bench.NamedRun{{Name: "sluice", Results: routedRun(0, 0)}, {Name: "least-connections", Results: routedRun(0, 0)}})
	if !math.IsInf(never.routed, 1) {
		t.Errorf("a Sluice run that never avoided the card: routed %v, want +Inf (never)", never.routed)
	}
}
