package scheduler

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/sessions"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// guessIndex is a PrefixIndex that guesses a fixed match per worker.
type guessIndex map[string]float64

func (g guessIndex) MatchSources(_ string, _ []uint64, workers []string, frac []float64, remote []bool) {
	for i, w := range workers {
		frac[i], remote[i] = g[w], false
	}
}
func (guessIndex) Record(string, []uint64, string) {}

// kvAnswers is a KVIndex that holds n leading blocks on the workers it
// names and cannot answer for the others.
type kvAnswers map[string]int

func (k kvAnswers) Match(worker string, _ []uint64) (int, int64, bool, string) {
	n, ok := k[worker]
	return n, 7, ok, ""
}

// The beliefs are a function of a value: the sources, applied in their
// order on candidates built by hand, with no Scheduler behind them.
func TestBeliefs_OnAValue(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := &Config{PrefixIndex: guessIndex{"a": 0.25, "b": 0.5, "c": 0.5, "d": 0.5}, KVIndex: kvAnswers{"d": 1}, StaleAfter: time.Second}
	b := beliefSrc{conf: &pickConf{cfg: cfg, sessions: true}, now: now,
		session: &sessions.Last{Worker: "c", Tokens: 300, First: 1}}
	req := &Request{Model: "m", Prefix: []uint64{1, 2, 3, 4}, KVBlocks: []uint64{1, 2, 3, 4}, Session: "s", PromptTokens: 400}
	fresh := &snapshot.Snapshot{CacheReport: &snapshot.CacheReport{At: now.Add(-time.Millisecond), Blocks: map[uint64]struct{}{1: {}, 2: {}, 3: {}}}}
	stale := &snapshot.Snapshot{CacheReport: &snapshot.CacheReport{At: now.Add(-time.Minute), Blocks: map[uint64]struct{}{1: {}, 2: {}, 3: {}, 4: {}}}}
	cands := []Candidate{
		{Name: "a", Snap: fresh},                // the fresh report says more than the guess
		{Name: "b", Snap: stale},                // a stale report is set aside
		{Name: "c", Snap: &snapshot.Snapshot{}}, // the session served its last turn here
		{Name: "d", Snap: &snapshot.Snapshot{}}, // the KV events answer, raised by a request in flight
	}
	sent := [][]kvSent{nil, nil, nil, {{keys: []uint64{1, 2, 9}}}}
	b.set(req, cands, func(j int) []kvSent { return sent[j] })
	want := []Belief{
		{PrefixMatch: 0.75, PrefixSource: prefixSourceReport},
		{PrefixMatch: 0.5, PrefixSource: prefixSourceIndex},
		{PrefixMatch: 0.75, PrefixSource: prefixSourceSession},
		{PrefixMatch: 0.5, PrefixSource: prefixSourceKVSent, KVSeq: 7},
	}
	for i := range cands {
		if cands[i].Belief != want[i] {
			t.Errorf("%s: belief %+v, want %+v", cands[i].Name, cands[i].Belief, want[i])
		}
	}
}

// The stages after the resolve stage run on a pick built by hand: every
// worker full at its learned limit, the one holding the prompt's prefix
// is borrowed for one stream more, and the pick's room lists the other.
func TestPickStages_OnAValue(t *testing.T) {
	conf := &pickConf{cfg: &Config{PrefixIndex: guessIndex{"w0": 0.2, "w1": 0.8}}, prefixWeighted: true, affinity: true}
	p := &pick{conf: conf, req: Request{Model: "m", Prefix: []uint64{1, 2}}, learning: true}
	p.env = Env{Now: time.Unix(1000, 0), Req: &p.req}
	p.beliefs = beliefSrc{conf: conf, now: p.env.Now}
	p.bufs = new(pickBufs)
	full := viewLimit{limit: 2, learned: 2, cap: 4, floor: 10, source: limit.Learned}
	for i, name := range []string{"w0", "w1"} {
		// The worker's own counters say nothing of it: the view's do.
		w := &worker{spec: WorkerSpec{Name: name}, order: i}
		p.views = append(p.views, view{w: w, snap: &snapshot.Snapshot{Health: snapshot.HealthOK}, serving: true, lim: full, active: 2, cost: 100})
	}
	p.eligible()
	if len(p.elig) != 1 || p.elig[0] != 1 {
		t.Fatalf("eligible %v, want [1]: w1 borrowed for its cached prefix", p.elig)
	}
	if v := &p.views[1]; v.lim.limit != 3 || v.lim.prefix != 0.8 || v.why != whyEligible {
		t.Errorf("w1: limit %d, prefix %v, why %d; want one stream over, for 0.8 of its prefix", v.lim.limit, v.lim.prefix, v.why)
	}
	if why := p.views[0].why; why != whyFull {
		t.Errorf("w0: why %d, want whyFull", why)
	}
	p.candidates()
	if c := p.cands[0]; c.Name != "w1" || c.Active != 2 || c.JobCost != 100 || c.PrefixMatch != 0.8 {
		t.Errorf("candidate %+v, want w1 as its view found it, with its belief", c)
	}
	if room := p.room(); len(room) != 1 || room[0].spec.Name != "w0" {
		t.Errorf("room %v, want w0 only", room)
	}
}
