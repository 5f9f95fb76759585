package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Meta records how a run was made, for results.json.
type Meta struct {
	// Name labels the run (a policy name in a comparison).
	Name string `json:"name,omitempty"`
	// Target, Model and Stream are as in RunConfig.
	Target string `json:"target"`
	Model  string `json:"model,omitempty"`
	Stream bool   `json:"stream"`
	// Load describes where the items came from, e.g. the trace path and
	// options or the synthetic parameters.
	Load string `json:"load"`
	// Seed is the seed the load was made with.
	Seed uint64 `json:"seed"`
	// Items is the number of requests scheduled.
	Items int `json:"items"`
	// Timeout and MaxInFlight are as in RunConfig.
	Timeout     time.Duration `json:"timeout_ns"`
	MaxInFlight int           `json:"max_in_flight"`
	// Started is the wall-clock start of the run.
	Started time.Time `json:"started"`
}

// ResultsFile is the content of results.json.
type ResultsFile struct {
	// Config says how the run was made; Summary what it measured.
	Config  Meta    `json:"config"`
	Summary Summary `json:"summary"`
}

// WriteJSON writes the configuration and summary of a run as indented
// JSON. Latencies in the summary are milliseconds; durations ending in _ns
// are nanoseconds.
func WriteJSON(w io.Writer, meta Meta, s Summary) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(ResultsFile{Config: meta, Summary: sanitize(s)}); err != nil {
		return fmt.Errorf("write results json: %w", err)
	}
	return nil
}

// sanitize replaces NaN and infinities, which JSON cannot hold, with 0.
func sanitize(s Summary) Summary {
	fix := func(p ...*float64) {
		for _, f := range p {
			if math.IsNaN(*f) || math.IsInf(*f, 0) {
				*f = 0
			}
		}
	}
	for _, d := range []*Dist{&s.TTFT, &s.E2E, &s.TPOT, &s.Lateness} {
		fix(&d.Mean, &d.P50, &d.P90, &d.P99, &d.Max, &d.TailRatio)
	}
	fix(&s.DecodeRate.Mean, &s.DecodeRate.P1, &s.DecodeRate.P5, &s.DecodeRate.P50, &s.DecodeRate.CV,
		&s.RequestsPerSec, &s.OutputTokensPerSec, &s.Goodput, &s.Attainment)
	return s
}

// csvHeader is the column list of requests.csv. Times are milliseconds.
var csvHeader = []string{"index", "row", "scheduled_ms", "start_ms", "lateness_ms", "prompt_tokens", "max_tokens",
	"ttft_ms", "e2e_ms", "tpot_ms", "output_tokens", "decode_tokens_per_s", "status", "kind", "reason",
	"retry_after", "worker", "queue_ms", "error"}

func fmtMs(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 3, 64) }

// WriteCSV writes one row per request, in the order given, under the
// header in csvHeader. Times are in milliseconds with microsecond
// precision; queue_ms is empty when the header was absent.
func WriteCSV(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("write requests csv: %w", err)
	}
	for _, r := range results {
		q := ""
		if r.QueueMs >= 0 {
			q = strconv.FormatFloat(r.QueueMs, 'f', -1, 64)
		}
		rec := []string{strconv.Itoa(r.Index), strconv.Itoa(r.Row), fmtMs(r.Scheduled), fmtMs(r.Start), fmtMs(r.Lateness),
			strconv.Itoa(r.PromptTokens), strconv.Itoa(r.MaxTokens), fmtMs(r.TTFT), fmtMs(r.E2E), fmtMs(r.TPOT),
			strconv.Itoa(r.OutputTokens), strconv.FormatFloat(r.DecodeRate, 'f', 3, 64), strconv.Itoa(r.Status),
			string(r.Kind), r.Reason, r.RetryAfter, r.Worker, q, r.Err}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("write requests csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write requests csv: %w", err)
	}
	return nil
}

// NamedRun is one labelled result set, e.g. the run of one routing policy
// in a comparison.
type NamedRun struct {
	// Name labels the run in tables, legends and file names.
	Name string
	// Results are the per-request measurements.
	Results []Result
	// SLO is the objective goodput is measured against.
	SLO SLO
}

// Summary summarises the run against its SLO.
func (n NamedRun) Summary() Summary { return Summarize(n.Results, n.SLO) }

type tableRow struct {
	label string
	value func(Summary) string
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// fms formats milliseconds with more decimals when small, so sub-ms TPOT
// values stay readable.
func fms(v float64) string {
	if math.Abs(v) < 10 {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return f1(v)
}

func distRows(name string, d func(Summary) Dist) []tableRow {
	return []tableRow{
		{name + " p50 (ms)", func(s Summary) string { return fms(d(s).P50) }},
		{name + " p90 (ms)", func(s Summary) string { return fms(d(s).P90) }},
		{name + " p99 (ms)", func(s Summary) string { return fms(d(s).P99) }},
		{name + " max (ms)", func(s Summary) string { return fms(d(s).Max) }},
		{name + " p99/p50", func(s Summary) string { return f2(d(s).TailRatio) }},
	}
}

// summaryRows are the rows of the human tables, shared by the single-run
// table and the side-by-side comparison.
var summaryRows = slicesConcat(
	[]tableRow{
		{"requests", func(s Summary) string { return strconv.Itoa(s.Count) }},
		{"ok", func(s Summary) string { return strconv.Itoa(s.OK) }},
		{"errors", func(s Summary) string { return strconv.Itoa(s.Errors) }},
		{"error kinds", func(s Summary) string { return countsString(s.ErrorsByKind) }},
		{"refusal reasons", func(s Summary) string { return countsString(s.Refusals) }},
		{"span (s)", func(s Summary) string { return f1(s.Span.Seconds()) }},
		{"throughput (req/s)", func(s Summary) string { return f2(s.RequestsPerSec) }},
		{"output (tok/s)", func(s Summary) string { return f1(s.OutputTokensPerSec) }},
		{"prompt cached (%)", func(s Summary) string { return f1(100 * s.PromptCached) }},
	},
	distRows("TTFT", func(s Summary) Dist { return s.TTFT }),
	distRows("E2E", func(s Summary) Dist { return s.E2E }),
	distRows("TPOT", func(s Summary) Dist { return s.TPOT }),
	[]tableRow{
		{"decode mean (tok/s)", func(s Summary) string { return f1(s.DecodeRate.Mean) }},
		{"decode p5 (tok/s)", func(s Summary) string { return f1(s.DecodeRate.P5) }},
		{"decode p1 (tok/s)", func(s Summary) string { return f1(s.DecodeRate.P1) }},
		{"decode CV", func(s Summary) string { return f2(s.DecodeRate.CV) }},
		{"SLO", func(s Summary) string { return s.SLO.String() }},
		{"goodput (req/s)", func(s Summary) string { return f2(s.Goodput) }},
		{"SLO attainment", func(s Summary) string { return fmt.Sprintf("%.1f%%", 100*s.Attainment) }},
		{"send lateness p99 (ms)", func(s Summary) string { return f1(s.Lateness.P99) }},
	},
)

func slicesConcat(parts ...[]tableRow) []tableRow {
	var out []tableRow
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func countsString(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// WriteTable prints a run's summary as an aligned two-column table.
func WriteTable(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range summaryRows {
		fmt.Fprintf(tw, "%s\t%s\n", row.label, row.value(s))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// WriteCompareTable prints the summaries of several runs side by side, one
// column per run.
func WriteCompareTable(w io.Writer, runs []NamedRun) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	sums := make([]Summary, len(runs))
	fmt.Fprint(tw, "\t")
	for i, r := range runs {
		sums[i] = r.Summary()
		fmt.Fprintf(tw, "%s\t", r.Name)
	}
	fmt.Fprintln(tw)
	for _, row := range summaryRows {
		fmt.Fprintf(tw, "%s\t", row.label)
		for _, s := range sums {
			fmt.Fprintf(tw, "%s\t", row.value(s))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write comparison table: %w", err)
	}
	return nil
}

// writeMarkdownTable writes the comparison as a Markdown table.
func writeMarkdownTable(w io.Writer, runs []NamedRun) {
	sums := make([]Summary, len(runs))
	fmt.Fprint(w, "| metric |")
	for i, r := range runs {
		sums[i] = r.Summary()
		fmt.Fprintf(w, " %s |", mdEscape(r.Name))
	}
	fmt.Fprint(w, "\n|---|")
	for range runs {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, row := range summaryRows {
		fmt.Fprintf(w, "| %s |", row.label)
		for _, s := range sums {
			fmt.Fprintf(w, " %s |", mdEscape(row.value(s)))
		}
		fmt.Fprintln(w)
	}
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// ProgressBar returns a progress callback for Run that redraws one line on
// w, or nil when w is not a terminal (so logs stay clean); isTerminal is
// normally golang.org/x/term's IsTerminal on the file's descriptor.
func ProgressBar(w io.Writer, isTerminal bool) func(Progress) {
	if !isTerminal {
		return nil
	}
	return func(p Progress) {
		const width = 30
		frac := 1.0
		if p.Total > 0 {
			frac = float64(p.Done) / float64(p.Total)
		}
		n := int(frac * width)
		bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
		fmt.Fprintf(w, "\r[%s] %d/%d done, %d in flight, %d failed, %s/%s ",
			bar, p.Done, p.Total, p.InFlight, p.Failed,
			p.Elapsed.Truncate(time.Second), p.Span.Truncate(time.Second))
		if p.Done == p.Total {
			fmt.Fprintln(w)
		}
	}
}

// WriteFile creates path, lets write fill it and reports close errors.
func WriteFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
