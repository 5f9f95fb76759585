package bench

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Agent describes a synthetic coding-agent load: sessions whose every
// request resends the whole conversation — one shared system prompt and
// tool definitions, then the turns so far — and adds one turn (the
// model's last answer and a tool's result, or the user's next message),
// so that 90% or more of each prompt repeats the previous one. Within a
// task the next request follows the last answer after a tool runs (a few
// seconds); between tasks the user reads and types (minutes). Items carry
// prefix hashes and their session (Item.Session), as an agent sending
// X-Session-ID would, and each request after a session's first names the
// one it follows (Item.After) and its pause after that one's answer
// (Item.Pause). At is the pauses summed from the session's start, as if
// answers took no time: a runner that follows After sends the request
// once the answer it needs has come; one that does not, at At, possibly
// while the request before it still runs.
type Agent struct {
	// Arrivals is the process of session starts' requests: sessions start
	// at Arrivals.Rate/Turns per second, so requests arrive at about Rate.
	Arrivals Arrivals
	// Count is the number of requests, the earliest Count.
	Count int
	// Turns is the mean number of requests of a session; 0 means 16.
	Turns float64
	// ToolTime is the mean pause between a request and the next within a
	// task (exponential); 0 means 3 s. UserTime is the mean pause
	// between tasks; 0 means 3 minutes. TaskTurns is the mean number of
	// requests of a task; 0 means 4.
	ToolTime, UserTime time.Duration
	TaskTurns          float64
	// SystemTokens is the shared system prompt and tools' length; 0 means
	// 2,000.
	SystemTokens int
	// Turn and Output are the lengths of a turn's new input (tool result
	// or user message) and of the model's answers; zero values take
	// AgentTurnLengths and AgentOutputLengths.
	Turn, Output Lengths
	// BlockTokens is the block size of the prefix hashes; 0 means 128.
	BlockTokens int
	// MaxPromptTokens ends a session before a request whose prompt would
	// be longer; 0 means 8,000 (the demo fleet's smallest KV cache).
	MaxPromptTokens int
	// Seed makes the load reproducible.
	Seed uint64
}

// The default lengths of an agent's turns: tool results and answers of a
// few hundred tokens.
var (
	AgentTurnLengths   = Lengths{Median: 220, Sigma: 0.7, Min: 20, Max: 2000}
	AgentOutputLengths = Lengths{Median: 120, Sigma: 0.8, Min: 8, Max: 1000}
)

// SynthesizeAgent generates an agent load sorted by arrival; the same
// Agent always gives the same items.
func SynthesizeAgent(a Agent) ([]Item, error) {
	if a.Count <= 0 {
		return nil, errors.New("agent: count must be positive")
	}
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&a.Turns, 16)
	def(&a.TaskTurns, 4)
	if a.ToolTime == 0 {
		a.ToolTime = 3 * time.Second
	}
	if a.UserTime == 0 {
		a.UserTime = 3 * time.Minute
	}
	if a.SystemTokens == 0 {
		a.SystemTokens = 2000
	}
	if a.Turn == (Lengths{}) {
		a.Turn = AgentTurnLengths
	}
	if a.Output == (Lengths{}) {
		a.Output = AgentOutputLengths
	}
	if a.BlockTokens == 0 {
		a.BlockTokens = 128
	}
	if a.MaxPromptTokens == 0 {
		a.MaxPromptTokens = 8000
	}
	if !(a.Turns >= 1) || !(a.TaskTurns >= 1) || a.ToolTime < 0 || a.UserTime < 0 || a.SystemTokens < 0 || a.BlockTokens <= 0 {
		return nil, fmt.Errorf("agent: turns and task turns must be at least 1, times and lengths not negative: %+v", a)
	}
	if err := errors.Join(a.Turn.validate(), a.Output.validate()); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	starts := a.Arrivals
	starts.Rate /= a.Turns
	times, err := starts.Times(a.Count, 0, a.Seed)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	rng := rand.New(rand.NewPCG(a.Seed, 0x6167656e74))
	more, moreTask := 1-1/a.Turns, 1-1/a.TaskTurns
	var items []Item
	for s, at := range times {
		history := a.SystemTokens
		session := "agent-" + strconv.Itoa(s)
		var pause time.Duration // before the next request, after the last answer
		for {
			prompt := history + a.Turn.sample(rng)
			if prompt > a.MaxPromptTokens {
				break
			}
			out := a.Output.sample(rng)
			items = append(items, Item{At: at, PromptTokens: prompt, OutputTokens: out, Session: session,
				Prefix: chatBlocks(0, uint64(s), a.SystemTokens, prompt, a.BlockTokens), PrefixBlockTokens: a.BlockTokens, Pause: pause})
			history = prompt + out
			if rng.Float64() >= more {
				break
			}
			mean := a.ToolTime
			if rng.Float64() >= moreTask {
				mean = a.UserTime
			}
			pause = time.Duration(rng.ExpFloat64() * float64(mean))
			at += pause
		}
	}
	slices.SortStableFunc(items, func(x, y Item) int { return cmp.Compare(x.At, y.At) })
	items = items[:min(len(items), a.Count)]
	last := map[string]int{} // each session's latest Row so far
	for i := range items {
		it := &items[i]
		it.Row = i + 1
		it.After = last[it.Session] // a session's requests keep their order: their At grow
		if it.After == 0 {
			it.Pause = 0
		}
		last[it.Session] = it.Row
	}
	return items, nil
}
