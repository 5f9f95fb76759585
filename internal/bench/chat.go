package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Chat describes a synthetic multi-turn chat load: conversations whose
// turn n sends the whole conversation so far (a shared system prompt, the
// earlier user messages and replies, the new user message), so a worker
// that served turn n-1 holds most of turn n's prompt in its prefix cache.
// Items carry prefix hashes (Item.Prefix) for that reuse.
type Chat struct {
	// Arrivals is the process of requests: conversations start at
	// Arrivals.Rate/Turns per second, so requests arrive at about Rate.
	Arrivals Arrivals
	// Count is the number of requests, the earliest Count turns.
	Count int
	// Turns is the mean number of turns of a conversation (geometric, at
	// least one); 0 means 4.
	Turns float64
	// Think is the mean pause between a turn and the next of the same
	// conversation (exponential, open loop: it does not wait for the
	// answer); 0 means 30 s.
	Think time.Duration
	// SystemPrompts is the number of distinct system prompts conversations
	// share; 0 means 4. SystemTokens is their length; 0 means 1000.
	SystemPrompts, SystemTokens int
	// User and Output are the lengths of user messages and of replies;
	// zero values take ChatUserLengths and DefaultOutputLengths.
	User, Output Lengths
	// BlockTokens is the block size of the items' prefix hashes; 0 means
	// 128.
	BlockTokens int
	// MaxPromptTokens ends a conversation before a turn whose prompt would
	// be longer; 0 means 8,000 (every prompt fits the demo fleet's
	// smallest KV cache, 8,192 tokens).
	MaxPromptTokens int
	// Seed makes the load reproducible.
	Seed uint64
}

// ChatUserLengths is the default length distribution of user messages.
var ChatUserLengths = Lengths{Median: 150, Sigma: 0.8, Min: 8, Max: 2000}

// SynthesizeChat generates a multi-turn chat load, sorted by arrival. The
// same Chat always gives the same items.
//
// Block j of a conversation's prompt lies either wholly inside its system
// prompt, and then its hash depends only on the system prompt and j, or
// not, and then it depends on the conversation and j: equal hashes mean
// equal first j+1 blocks, as chained hashes do.
func SynthesizeChat(c Chat) ([]Item, error) {
	if c.Count <= 0 {
		return nil, errors.New("chat: count must be positive")
	}
	if c.Turns == 0 {
		c.Turns = 4
	}
	if c.Think == 0 {
		c.Think = 30 * time.Second
	}
	if c.SystemPrompts == 0 {
		c.SystemPrompts = 4
	}
	if c.SystemTokens == 0 {
		c.SystemTokens = 1000
	}
	if c.User == (Lengths{}) {
		c.User = ChatUserLengths
	}
	if c.Output == (Lengths{}) {
		c.Output = DefaultOutputLengths
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 128
	}
	if c.MaxPromptTokens == 0 {
		c.MaxPromptTokens = 8000
	}
	var errs []error
	if !(c.Turns >= 1) || math.IsInf(c.Turns, 0) {
		errs = append(errs, fmt.Errorf("turns: must be at least 1, got %v", c.Turns))
	}
	if c.Think < 0 || c.SystemPrompts < 0 || c.SystemTokens < 0 || c.BlockTokens < 0 || c.MaxPromptTokens < 0 {
		errs = append(errs, errors.New("think, system prompts, system tokens, block tokens and max prompt tokens must not be negative"))
	}
	if err := c.User.validate(); err != nil {
		errs = append(errs, fmt.Errorf("user %w", err))
	}
	if err := c.Output.validate(); err != nil {
		errs = append(errs, fmt.Errorf("output %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	starts := c.Arrivals
	starts.Rate /= c.Turns
	times, err := starts.Times(c.Count, 0, c.Seed)
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x63686174))
	more := 1 - 1/c.Turns // chance of another turn
	var items []Item
	for conv, at := range times {
		sys := rng.IntN(c.SystemPrompts)
		history := c.SystemTokens
		for turn := 0; ; turn++ {
			prompt := history + c.User.sample(rng)
			if prompt > c.MaxPromptTokens {
				break
			}
			out := c.Output.sample(rng)
			items = append(items, Item{At: at, PromptTokens: prompt, OutputTokens: out,
				Prefix: chatBlocks(uint64(sys), uint64(conv), c.SystemTokens, prompt, c.BlockTokens), PrefixBlockTokens: c.BlockTokens})
			history = prompt + out
			if rng.Float64() >= more {
				break
			}
			at += time.Duration(rng.ExpFloat64() * float64(c.Think))
		}
	}
	slices.SortStableFunc(items, func(a, b Item) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
	items = items[:min(len(items), c.Count)]
	for i := range items {
		items[i].Row = i + 1
	}
	return items, nil
}

// chatBlocks returns the hashes of the whole blocks of a prompt of
// tokens tokens in conversation conv with system prompt sys of sysTokens.
func chatBlocks(sys, conv uint64, sysTokens, tokens, block int) []uint64 {
	n := tokens / block
	out := make([]uint64, n)
	for j := range out {
		if (j+1)*block <= sysTokens {
			out[j] = mix(1<<62 | sys<<32 | uint64(j))
		} else {
			out[j] = mix(2<<62 | conv<<24 | uint64(j))
		}
	}
	return out
}

// mix is SplitMix64's finaliser: distinct inputs give distinct, well
// spread outputs.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
