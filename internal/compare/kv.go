package compare

import (
	"bytes"
	"fmt"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/vsim"
)

// KVRow names the row of Sluice with the exact index of KV events.
const KVRow = "sluice + KV events"

// writeExpectedCached sets, row by row, the prompt tokens the router
// expected the chosen workers to hold (vsim.Stats.ExpectedCached in
// virtual time, the decision records' expected_cached_tokens over real
// HTTP) against those the engines found cached: how right each index
// was.
func writeExpectedCached(md *bytes.Buffer, runs []bench.NamedRun, expected map[string]int64, virtual bool) {
	how := "with KV events the index's match in whole blocks at the moment of binding, capped as the engine caps a hit; with the guess the prefix term's match × the prompt"
	if !virtual {
		how = "the decision records' expected_cached_tokens: the chosen worker's prefix match × the prompt, from the exact index with KV events, from the guess without"
	}
	fmt.Fprintf(md, "Prompt tokens cached, as the router expected them at the chosen worker (%s) and as the engines found them (successful requests' prompts; the baselines expect nothing):\n\n| row | prompt tokens | expected cached | found cached | expected − found | TTFT p50 / p99 (ms) |\n| --- | ---: | ---: | ---: | ---: | ---: |\n", how)
	for _, r := range runs {
		var prompt, found int64
		for _, x := range r.Results {
			if x.Status == 200 {
				prompt += int64(x.PromptTokens)
				found += int64(x.CachedTokens)
			}
		}
		s := r.Summary()
		exp := expected[r.Name]
		diff := "-"
		if found > 0 {
			diff = fmt.Sprintf("%+.2f%% of found", 100*float64(exp-found)/float64(found))
		}
		fmt.Fprintf(md, "| %s | %d | %d (%.1f%%) | %d (%.1f%%) | %s | %.0f / %.0f |\n", r.Name, prompt, exp, pct(exp, prompt), found, pct(found, prompt), diff, s.TTFT.P50, s.TTFT.P99)
	}
	fmt.Fprintln(md)
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// writeKVState says, for a real-HTTP run with KV events, how many
// decisions read the exact index and what each worker's subscriber saw.
func writeKVState(md *bytes.Buffer, hs *vsim.HTTPStats, requests int) {
	if hs == nil {
		return
	}
	fmt.Fprintf(md, "KV events over ZeroMQ (row \"%s\"): %d bound decisions of %d requests read the exact index on the chosen worker (the others, before a worker's first stored block told its block size or with no token ids, read the guess).\n\n| worker | last seq | blocks held | block size | in sync | seq gaps | repaired by replay |\n| --- | ---: | ---: | ---: | --- | ---: | ---: |\n", KVRow, hs.KVDecisions, requests)
	for _, k := range hs.KV {
		fmt.Fprintf(md, "| %s | %d | %d | %d | %v | %d | %d |\n", k.Worker, k.Seq, k.Blocks, k.BlockSize, k.Synced, k.Gaps, k.Replays)
	}
	fmt.Fprintln(md)
}
