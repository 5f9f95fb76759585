package vsim

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
)

// A request that follows another's answer (bench.Item.After) arrives its
// pause after that answer ended, whatever its At says, and its times are
// counted from then; one naming no item of the load arrives at its At.
func TestRun_FollowerArrivesItsPauseAfterTheAnswer(t *testing.T) {
	cfg := DefaultConfig(fleetOf(2, nil))
	items := []bench.Item{
		{At: 0, PromptTokens: 1500, OutputTokens: 200, Row: 1},
		{At: 10 * time.Millisecond, PromptTokens: 1700, OutputTokens: 20, Row: 2, After: 1, Pause: 2 * time.Second},
		{At: 20 * time.Millisecond, PromptTokens: 1900, OutputTokens: 20, Row: 3, After: 2}, // no pause
		{At: 30 * time.Millisecond, PromptTokens: 100, OutputTokens: 20, Row: 4, After: 99, Pause: time.Hour},
	}
	res := mustRun(t, cfg, items)
	for i, r := range res {
		if !r.OK() {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if want := res[0].Start + res[0].E2E + 2*time.Second; res[1].Start != want || res[1].Scheduled != want {
		t.Errorf("second request sent at %v (scheduled %v), want %v: 2 s after the first's answer ended", res[1].Start, res[1].Scheduled, want)
	}
	if want := res[1].Start + res[1].E2E; res[2].Start != want {
		t.Errorf("third request sent at %v, want %v: as the second's answer ended", res[2].Start, want)
	}
	if res[3].Start != 30*time.Millisecond {
		t.Errorf("a request following no item of the load sent at %v, want its At", res[3].Start)
	}
	// Alone on an idle worker, its first token is its prefill alone.
	if res[1].TTFT <= 0 || res[1].TTFT > time.Second || res[1].QueueMs != 0 {
		t.Errorf("second request: TTFT %v, queued %v ms; want it counted from its own arrival", res[1].TTFT, res[1].QueueMs)
	}
}

// Sessions of the agent load wait for their answers: no request of a
// session is bound before the one before it has ended.
func TestRun_AgentSessionsWaitForTheirAnswers(t *testing.T) {
	fleet, base := agentLoad(t)
	items, err := AtRate(base[:600], 0.8*Capacity(fleet, base))
	if err != nil {
		t.Fatal(err)
	}
	res := mustRun(t, DefaultConfig(fleet), items)
	last := map[string]int{}
	for _, i := range byStart(res) {
		s := items[i].Session
		if j, ok := last[s]; ok {
			if end := res[j].Start + res[j].E2E; res[i].Start < end+items[i].Pause {
				t.Fatalf("session %s: request %d sent at %v, the one before ended at %v, pause %v", s, i, res[i].Start, end, items[i].Pause)
			}
		}
		last[s] = i
	}
}

// byStart is the indexes of res by send time.
func byStart(res []bench.Result) []int {
	out := make([]int, len(res))
	for i := range out {
		out[i] = i
	}
	slices.SortStableFunc(out, func(a, b int) int { return cmp.Compare(res[a].Start, res[b].Start) })
	return out
}
