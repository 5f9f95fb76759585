package bench

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Item is one request of a load: when it arrives and how big it is.
type Item struct {
	// At is the arrival offset from the start of the run.
	At time.Duration
	// PromptTokens is the number of prompt tokens to send.
	PromptTokens int
	// OutputTokens is the number of tokens the worker must generate.
	OutputTokens int
	// Row is the 1-based source line in the trace file (the header is line
	// 1), or the 1-based sequence number for synthetic loads.
	Row int
	// Prefix holds the chained hashes of the prompt's blocks of
	// PrefixBlockTokens tokens: hash i covers blocks 0..i, so two items
	// share hash i exactly when their prompts share the first i+1 blocks
	// (Mooncake's hash_ids, 512-token blocks). Empty when the load says
	// nothing about shared prefixes.
	Prefix            []uint64
	PrefixBlockTokens int
	// Session names the conversation or agent session the item belongs
	// to, as a client's X-Session-ID would; empty when the load does not
	// say.
	Session string
	// After, when not 0, is the Row of the item whose answer this one
	// needs (an agent's next turn needs the last answer): it is sent
	// Pause after that answer has ended, and At is only what that would
	// be were answers instant. The virtual-time simulation (vsim.Run)
	// follows it; other runners send the item at At.
	After int
	Pause time.Duration
}

// MooncakeBlockTokens is the block size of Mooncake's hash_ids.
const MooncakeBlockTokens = 512

// Format names a trace file layout.
type Format string

// The trace formats ReadTrace understands.
const (
	// FormatAuto detects the format from the extension and the header.
	FormatAuto Format = ""
	// FormatAzure is the Azure LLM inference trace CSV: TIMESTAMP,
	// ContextTokens, GeneratedTokens.
	FormatAzure Format = "azure"
	// FormatMooncake is Mooncake's JSONL: timestamp (ms, quantised to
	// buckets), input_length, output_length, hash_ids.
	FormatMooncake Format = "mooncake"
	// FormatLengths is a CSV with num_prefill_tokens and num_decode_tokens
	// and no timestamps (ShareGPT, arXiv summarisation); arrivals are
	// synthesised.
	FormatLengths Format = "lengths"
)

// TraceOptions controls how a trace becomes a load. The zero value replays
// every row at recorded speed.
type TraceOptions struct {
	// Format forces a format; FormatAuto detects it.
	Format Format
	// Offset skips this many data rows before the window starts.
	Offset int
	// Limit keeps at most this many data rows (0 = all).
	Limit int
	// Speedup divides every arrival offset (time compression); 0 or 1
	// replays at recorded speed.
	Speedup float64
	// TargetRate, when positive, rescales arrivals so that the mean rate
	// over the window is this many requests per second. It cannot be
	// combined with Speedup. For length-only traces it is the arrival rate
	// when Arrivals.Rate is unset.
	TargetRate float64
	// MaxDuration drops items arriving after this offset (0 = no limit).
	MaxDuration time.Duration
	// Seed seeds Mooncake bucket jitter and synthetic arrivals.
	Seed uint64
	// MooncakeBucket is the timestamp quantum of Mooncake traces; arrivals
	// are spread uniformly within it. Zero means 3 s.
	MooncakeBucket time.Duration
	// Arrivals is the arrival process for length-only traces.
	Arrivals Arrivals
}

// ReadTrace reads a trace file and turns it into a load, sorted by arrival.
// Errors name the file and line.
func ReadTrace(path string, opts TraceOptions) ([]Item, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	if opts.Format == FormatAuto {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".jsonl", ".json", ".ndjson":
			opts.Format = FormatMooncake
		}
	}
	return ParseTrace(f, path, opts)
}

// ParseTrace reads a trace from r; name is used in error messages. With
// FormatAuto the format is detected from the content: a leading '{' means
// Mooncake JSONL, otherwise the CSV header decides.
func ParseTrace(r io.Reader, name string, opts TraceOptions) ([]Item, error) {
	if opts.Speedup < 0 || opts.TargetRate < 0 || math.IsNaN(opts.Speedup) || math.IsNaN(opts.TargetRate) {
		return nil, fmt.Errorf("%s: speedup and target rate must not be negative", name)
	}
	if opts.Speedup != 0 && opts.Speedup != 1 && opts.TargetRate > 0 {
		return nil, fmt.Errorf("%s: set at most one of speedup and target rate", name)
	}
	if opts.Offset < 0 || opts.Limit < 0 {
		return nil, fmt.Errorf("%s: offset and limit must not be negative", name)
	}
	br := bufio.NewReaderSize(r, 64<<10)
	format := opts.Format
	if format == FormatAuto {
		head, _ := br.Peek(512)
		head = bytes.TrimLeft(bytes.TrimPrefix(head, []byte("\xef\xbb\xbf")), " \t\r\n")
		if len(head) > 0 && head[0] == '{' {
			format = FormatMooncake
		}
	}
	var (
		items []Item
		timed = true
		err   error
	)
	switch format {
	case FormatMooncake:
		items, err = parseMooncake(br, name, opts)
	case FormatAuto, FormatAzure, FormatLengths:
		items, timed, err = parseCSV(br, name, format, opts)
	default:
		return nil, fmt.Errorf("%s: unknown trace format %q", name, format)
	}
	if err != nil {
		return nil, err
	}
	if !timed {
		arr := opts.Arrivals
		if arr.Rate == 0 {
			arr.Rate = opts.TargetRate
		}
		if arr.Rate <= 0 {
			return nil, fmt.Errorf("%s: trace has no timestamps: an arrival rate is needed", name)
		}
		times, err := arr.Times(len(items), 0, opts.Seed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for i := range items {
			items[i].At = times[i]
		}
		return cutDuration(items, opts.MaxDuration), nil
	}
	return shapeTimes(items, opts), nil
}

// shapeTimes rebases, sorts, compresses or rescales and cuts timed items.
func shapeTimes(items []Item, opts TraceOptions) []Item {
	if len(items) == 0 {
		return items
	}
	slices.SortStableFunc(items, func(a, b Item) int {
		if a.At != b.At {
			if a.At < b.At {
				return -1
			}
			return 1
		}
		return a.Row - b.Row
	})
	base := items[0].At
	for i := range items {
		items[i].At -= base
	}
	factor := 1.0
	if opts.Speedup > 0 {
		factor = 1 / opts.Speedup
	}
	if span := items[len(items)-1].At; opts.TargetRate > 0 && span > 0 && len(items) > 1 {
		// Mean rate over the window is (n-1)/span; scale the span so that
		// it becomes TargetRate.
		factor = float64(len(items)-1) / opts.TargetRate / span.Seconds()
	}
	if factor != 1 {
		for i := range items {
			items[i].At = time.Duration(float64(items[i].At) * factor)
		}
	}
	return cutDuration(items, opts.MaxDuration)
}

func cutDuration(items []Item, max time.Duration) []Item {
	if max <= 0 {
		return items
	}
	n, _ := slices.BinarySearchFunc(items, max, func(it Item, t time.Duration) int {
		if it.At <= t {
			return -1
		}
		return 1
	})
	return items[:n]
}

// window reports whether the data row with 0-based index i is inside the
// offset/limit window, and whether reading can stop.
func window(i int, opts TraceOptions) (keep, done bool) {
	if i < opts.Offset {
		return false, false
	}
	if opts.Limit > 0 && i >= opts.Offset+opts.Limit {
		return false, true
	}
	return true, false
}

// azureLayout is the Azure trace's timestamp layout; time.Parse accepts the
// fractional seconds (7 digits in the trace) without them being spelled out.
const azureLayout = "2006-01-02 15:04:05"

func parseCSV(r io.Reader, name string, format Format, opts TraceOptions) (items []Item, timed bool, err error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, false, fmt.Errorf("%s: empty trace", name)
		}
		return nil, false, fmt.Errorf("%s: header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := col[h]; !dup {
			col[h] = i
		}
	}
	has := func(names ...string) bool {
		for _, n := range names {
			if _, ok := col[n]; !ok {
				return false
			}
		}
		return true
	}
	var cols []string // timestamp (optional), prompt, output
	switch {
	case (format == FormatAuto || format == FormatAzure) && has("TIMESTAMP", "ContextTokens", "GeneratedTokens"):
		cols, timed = []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}, true
	case (format == FormatAuto || format == FormatLengths) && has("num_prefill_tokens", "num_decode_tokens"):
		cols = []string{"", "num_prefill_tokens", "num_decode_tokens"}
	default:
		return nil, false, fmt.Errorf("%s:1: unrecognised header %q: want TIMESTAMP,ContextTokens,GeneratedTokens or num_prefill_tokens,num_decode_tokens", name, strings.Join(header, ","))
	}
	var t0 time.Time
	for i := 0; ; i++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, false, fmt.Errorf("%s:%d: %v", name, pe.Line, pe.Err)
			}
			return nil, false, fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		keep, done := window(i, opts)
		if done {
			break
		}
		if !keep {
			continue
		}
		field := func(c string) (string, error) {
			j := col[c]
			if j >= len(rec) {
				return "", fmt.Errorf("%s:%d: %s: missing field", name, line, c)
			}
			return strings.TrimSpace(rec[j]), nil
		}
		it := Item{Row: line}
		if timed {
			s, err := field(cols[0])
			if err != nil {
				return nil, false, err
			}
			ts, err := time.Parse(azureLayout, s)
			if err != nil {
				return nil, false, fmt.Errorf("%s:%d: %s: not a timestamp like 2023-11-16 18:15:46.6805900: %q", name, line, cols[0], s)
			}
			if t0.IsZero() {
				t0 = ts
			}
			it.At = ts.Sub(t0)
		}
		for k, dst := range []*int{&it.PromptTokens, &it.OutputTokens} {
			s, err := field(cols[k+1])
			if err != nil {
				return nil, false, err
			}
			n, err := parseCount(s)
			if err != nil {
				return nil, false, fmt.Errorf("%s:%d: %s: %v", name, line, cols[k+1], err)
			}
			*dst = n
		}
		items = append(items, it)
	}
	return items, timed, nil
}

// maxTokens bounds token counts read from traces; anything larger is a
// corrupt row, not a prompt.
const maxTokens = 10_000_000

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		// Some exports write counts as floats ("129.0").
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("not a number: %q", s)
		}
		if f < 0 || f > maxTokens {
			return 0, fmt.Errorf("out of range: %q", s)
		}
		n = int(f)
	}
	if n < 0 || n > maxTokens {
		return 0, fmt.Errorf("out of range: %q", s)
	}
	return n, nil
}

type mooncakeRow struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

func parseMooncake(r io.Reader, name string, opts TraceOptions) ([]Item, error) {
	bucket := opts.MooncakeBucket
	if bucket <= 0 {
		bucket = 3 * time.Second
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x6d6f6f6e63616b65))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var items []Item
	line, i := 0, 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
		}
		if len(b) == 0 {
			continue
		}
		keep, done := window(i, opts)
		i++
		if done {
			break
		}
		if !keep {
			continue
		}
		var row mooncakeRow
		if err := json.Unmarshal(b, &row); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		switch {
		case row.Timestamp == nil:
			return nil, fmt.Errorf("%s:%d: timestamp: missing", name, line)
		case row.InputLength == nil:
			return nil, fmt.Errorf("%s:%d: input_length: missing", name, line)
		case row.OutputLength == nil:
			return nil, fmt.Errorf("%s:%d: output_length: missing", name, line)
		case *row.Timestamp < 0 || *row.Timestamp > 1e12:
			return nil, fmt.Errorf("%s:%d: timestamp: out of range: %v", name, line, *row.Timestamp)
		case *row.InputLength < 0 || *row.InputLength > maxTokens:
			return nil, fmt.Errorf("%s:%d: input_length: out of range: %d", name, line, *row.InputLength)
		case *row.OutputLength < 0 || *row.OutputLength > maxTokens:
			return nil, fmt.Errorf("%s:%d: output_length: out of range: %d", name, line, *row.OutputLength)
		}
		// Spread each quantised timestamp uniformly over its bucket, so a
		// replay does not fire ten requests in the same microsecond.
		at := time.Duration(*row.Timestamp*float64(time.Millisecond)) + time.Duration(rng.Int64N(int64(bucket)))
		it := Item{At: at, PromptTokens: *row.InputLength, OutputTokens: *row.OutputLength, Row: line}
		if len(row.HashIDs) > 0 {
			it.Prefix, it.PrefixBlockTokens = make([]uint64, len(row.HashIDs)), MooncakeBlockTokens
			for k, h := range row.HashIDs {
				it.Prefix[k] = uint64(h)
			}
		}
		items = append(items, it)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	return items, nil
}
