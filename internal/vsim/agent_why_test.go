package vsim

import (
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// turnMoves counts, over a run, where each session's next request (any
// after its first) went against the worker of the one before, and why a
// moved one moved, from its decision record and the engines' caches at
// the moment it was bound.
type turnMoves struct {
	next, stayed, moved int
	// prevRunning: the request before was still running on its worker;
	// movedRunning: of the moved ones.
	prevRunning, movedRunning int
	// The moved ones: the worker before was not eligible (the KV-fit
	// rule, its concurrency limit, anything else), or was and lost, with
	// more requests in flight than the chosen one or not.
	kvFit, full, otherIneligible int
	lostBusier, lostEven         int
	// herdBound: eligible, but binding there would have made it run two
	// or more, over 1.5× the mean, while another worker ran nothing.
	herdBound int
	// prevHeld: the worker before still held more of the prompt than the
	// shared system prompt (the conversation), by its engine's cache.
	prevHeld int
	// Cached prompt tokens over prompt tokens of the stayed and moved.
	stayedCached, stayedPrompt, movedCached, movedPrompt int
}

// whyTurnsMove runs items under cfg (records on) and counts turnMoves;
// sysBlocks is the shared system prompt's length in prefix blocks.
func whyTurnsMove(t *testing.T, cfg Config, items []bench.Item, sysBlocks int) turnMoves {
	t.Helper()
	cfg.Recorder = func(*decisions.Record) {}
	r, err := newRun(cfg, items)
	if err != nil {
		t.Fatal(err)
	}
	var m turnMoves
	last := map[string]int{} // session: its latest request bound
	stayed := make([]int8, len(items))
	r.onBind = func(i int, l *scheduler.Lease) {
		it := &r.reqs[i].item
		prev, ok := last[it.Session]
		last[it.Session] = i
		if !ok || it.Session == "" {
			return
		}
		m.next++
		from, to := r.reqs[prev].worker, r.byName[l.Worker]
		if !r.reqs[prev].ended {
			m.prevRunning++
		}
		if from == to {
			m.stayed++
			stayed[i] = 1
			return
		}
		m.moved++
		stayed[i] = -1
		if !r.reqs[prev].ended {
			m.movedRunning++
		}
		if r.workers[from].eng.PrefixHeld(it.Prefix) > sysBlocks {
			m.prevHeld++
		}
		rec := l.Decision.Explain()
		var was, now *decisions.Candidate
		sum, idle := 1, false
		for k := range rec.Candidates {
			c := &rec.Candidates[k]
			switch c.Worker {
			case r.workers[from].name:
				was = c
			case l.Worker:
				now = c
			}
			sum += c.Active
		}
		for k := range rec.Candidates {
			idle = idle || (rec.Candidates[k].Active == 0 && &rec.Candidates[k] != was)
		}
		switch {
		case was == nil || now == nil:
			t.Fatalf("request %d: record without the workers %s and %s", i, r.workers[from].name, l.Worker)
		case !was.Eligible && strings.Contains(was.Why, "free KV cache"):
			m.kvFit++
		case !was.Eligible && strings.Contains(was.Why, "max_concurrency"):
			m.full++
		case !was.Eligible:
			m.otherIneligible++
		case was.Active > now.Active:
			m.lostBusier++
		default:
			m.lostEven++
		}
		if after := was.Active + 1; was.Eligible && idle && after >= 2 && float64(after) > 1.5*float64(sum)/float64(len(rec.Candidates)) {
			m.herdBound++
		}
	}
	r.loop()
	for i, res := range r.results {
		switch stayed[i] {
		case 1:
			m.stayedCached += res.CachedTokens
			m.stayedPrompt += res.PromptTokens
		case -1:
			m.movedCached += res.CachedTokens
			m.movedPrompt += res.PromptTokens
		}
	}
	return m
}

// TestRun_AgentSessionsWhyTurnsMove counts, on the agent load of
// TestRun_AgentSessions (Sluice with the session hint), why a session's
// next request left the worker of the one before: docs/routing.md, Agent
// sessions, quotes it. Requests wait for the answer they follow, so none
// finds its predecessor running; sent at their open-loop times instead,
// half do, and then the conversation's own previous request is the one
// request more that the score sends the next away from.
//
//	go test -run TestRun_AgentSessionsWhyTurnsMove -v ./internal/vsim/
func TestRun_AgentSessionsWhyTurnsMove(t *testing.T) {
	fleet, base := agentLoad(t)
	open := openLoop(base)
	// What a router could find at best: every request its session's
	// previous prompt (a first, the system prompt), in whole blocks.
	best, sys, all := 0, 0, 0
	prev := map[string]int{}
	for _, it := range base {
		held, ok := prev[it.Session]
		if !ok {
			held = 2000
		}
		best += min(held/128*128, it.PromptTokens-1)
		sys += 2000 / 128 * 128
		all += it.PromptTokens
		prev[it.Session] = it.PromptTokens
	}
	t.Logf("a router finding every previous prompt cached would find %.1f%% of prompt tokens; the system prompt alone is %.1f%%", pct(best, all), pct(sys, all))
	for _, load := range []float64{0.5, 0.8} {
		for _, v := range []struct {
			name   string
			items  []bench.Item
			closed bool
		}{{"open loop", open, false}, {"closed loop", base, true}} {
			items, err := AtRate(v.items, load*Capacity(fleet, v.items))
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig(fleet)
			cfg.SessionAffinity = true
			m := whyTurnsMove(t, cfg, items, 2000/128)
			t.Logf("load %.0f%%, %s: %d next turns, %d stayed (%.0f%% of their prompt cached), %d moved (%.0f%%); %d found the turn before still running, %d of them moved",
				100*load, v.name, m.next, m.stayed, pct(m.stayedCached, m.stayedPrompt), m.moved, pct(m.movedCached, m.movedPrompt), m.prevRunning, m.movedRunning)
			t.Logf("  moved: worker before ineligible %d (KV fit %d, at its limit %d, other %d), eligible and lost %d (running more than the chosen %d, not %d); would have herded there %d; it still held the conversation %d",
				m.kvFit+m.full+m.otherIneligible, m.kvFit, m.full, m.otherIneligible, m.lostBusier+m.lostEven, m.lostBusier, m.lostEven, m.herdBound, m.prevHeld)
			if m.stayed+m.moved != m.next || m.kvFit+m.full+m.otherIneligible+m.lostBusier+m.lostEven != m.moved {
				t.Errorf("%+v: the counts do not add up", m)
			}
			if v.closed && m.prevRunning != 0 {
				t.Errorf("load %.0f%%, %s: %d requests bound before the answer they follow ended", 100*load, v.name, m.prevRunning)
			}
			if !v.closed && m.prevRunning < m.next/4 {
				t.Errorf("load %.0f%%, %s: only %d of %d next requests found the one before running", 100*load, v.name, m.prevRunning, m.next)
			}
		}
	}
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
