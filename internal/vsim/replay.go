package vsim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
)

// DefaultReplayOutput is the output length given to a replayed request
// whose decision record has no max_tokens.
const DefaultReplayOutput = 256

// ParseDecisions turns a decision log (JSONL of decisions.Record, as the
// router's decisions.file writes) into a load: one item per first attempt
// (retries are the router's doing, not demand), arriving at the record's
// time minus its queue wait, with its prompt tokens and max_tokens as the
// output length (DefaultReplayOutput when unset). Refused requests are
// kept: they were demand too. A decision's first-token line, written after
// it (decisions.Log.AddFirstToken: an id and ttft_ms, no time), is not
// demand and is skipped. name is used in errors.
func ParseDecisions(r io.Reader, name string) ([]bench.Item, error) {
	type rec struct {
		Time         time.Time `json:"time"`
		Attempt      int       `json:"attempt"`
		PromptTokens int       `json:"prompt_tokens"`
		MaxTokens    int       `json:"max_tokens"`
		QueueWaitMs  float64   `json:"queue_wait_ms"`
		TTFTMs       *float64  `json:"ttft_ms"`
	}
	type arrival struct {
		at   time.Time
		item bench.Item
	}
	var arr []arrival
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var d rec
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if d.Time.IsZero() && d.TTFTMs != nil {
			continue // a first-token line: the decision above it is the demand
		}
		if d.Time.IsZero() {
			return nil, fmt.Errorf("%s:%d: record has no time", name, line)
		}
		if d.Attempt > 1 {
			continue
		}
		out := d.MaxTokens
		if out <= 0 {
			out = DefaultReplayOutput
		}
		at := d.Time.Add(-time.Duration(d.QueueWaitMs * float64(time.Millisecond)))
		arr = append(arr, arrival{at, bench.Item{PromptTokens: max(d.PromptTokens, 1), OutputTokens: out, Row: line}})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(arr) == 0 {
		return nil, fmt.Errorf("%s: no first-attempt decision records", name)
	}
	slices.SortStableFunc(arr, func(a, b arrival) int { return a.at.Compare(b.at) })
	items := make([]bench.Item, len(arr))
	for i, a := range arr {
		items[i] = a.item
		items[i].At = a.at.Sub(arr[0].at)
	}
	return items, nil
}

// ReadLoad reads a load from path: a Sluice decision log (JSONL whose
// first record has "policy" and "candidates") through ParseDecisions,
// anything else through bench.ReadTrace with opts.
func ReadLoad(path string, opts bench.TraceOptions) ([]bench.Item, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("vsim: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	head, _ := br.Peek(64 << 10)
	if isDecisionLog(head) {
		items, err := ParseDecisions(br, path)
		if err != nil {
			return nil, fmt.Errorf("vsim: %w", err)
		}
		return items, nil
	}
	f.Close()
	return bench.ReadTrace(path, opts)
}

func isDecisionLog(head []byte) bool {
	head = bytes.TrimSpace(head)
	if len(head) == 0 || head[0] != '{' {
		return false
	}
	if i := bytes.IndexByte(head, '\n'); i >= 0 {
		head = head[:i]
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(head, &probe) != nil {
		return false
	}
	_, p := probe["policy"]
	_, c := probe["candidates"]
	return p && c
}
