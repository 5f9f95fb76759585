package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func sampleResults(workers ...string) []Result {
	var out []Result
	for i := 0; i < 40; i++ {
		r := ok(time.Duration(i)*50*time.Millisecond, time.Duration(50+i*3)*time.Millisecond, time.Duration(400+i*20)*time.Millisecond, 10+i)
		r.Index, r.Row, r.Scheduled, r.Worker = i, i+2, r.Start, workers[i%len(workers)]
		r.MaxTokens = r.OutputTokens
		out = append(out, r)
	}
	out[5].Kind, out[5].Status, out[5].Reason, out[5].RetryAfter, out[5].Err = KindRefused, 503, "no_worker", "1", "503 Service Unavailable: busy, \"quoted\""
	out[6].QueueMs = 3.25
	return out
}

func TestWriteReport_FilesAndMarkdown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "report")
	runs := []NamedRun{
		{Name: "round-robin", Results: sampleResults("w1", "w2"), SLO: SLO{TTFT: 100 * time.Millisecond}},
		{Name: "sluice", Results: sampleResults("w1", "w2", "w3"), SLO: SLO{TTFT: 100 * time.Millisecond}},
		{Name: "empty", SLO: SLO{}},
	}
	paths, err := WriteReport(dir, runs)
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	svgs := 0
	for _, p := range paths {
		if filepath.Ext(p) != ".svg" {
			continue
		}
		svgs++
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(f)
		root := ""
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: not XML: %v", p, err)
			}
			if se, ok := tok.(xml.StartElement); ok && root == "" {
				root = se.Name.Local
			}
		}
		f.Close()
		if root != "svg" {
			t.Errorf("%s: root element %q", p, root)
		}
		if !bytes.Contains(md, []byte("]("+filepath.Base(p)+")")) {
			t.Errorf("report.md does not embed %s", filepath.Base(p))
		}
	}
	if want := 4 + len(runs); svgs != want {
		t.Errorf("%d SVGs, want %d", svgs, want)
	}
	for _, s := range []string{"| metric | round-robin | sluice | empty |", "| TTFT p99/p50 |", "| goodput (req/s) |"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("report.md lacks %q:\n%s", s, md)
		}
	}
	if _, err := WriteReport(dir, []NamedRun{{Name: "a"}, {Name: "a"}}); err == nil {
		t.Error("duplicate names accepted")
	}
}

func TestConcurrency_StepsPerWorker(t *testing.T) {
	s := time.Second
	got := concurrency([]Result{
		{Worker: "b", Start: 0, E2E: 2 * s},
		{Worker: "b", Start: s, E2E: 2 * s},
		{Worker: "b", Start: 3 * s, E2E: s}, // starts as the second ends
		{Worker: "a", Start: 0, E2E: s},
		{Start: 0, E2E: s}, // no worker header: not plotted
	})
	if len(got) != 2 || got[0].name != "a" || got[1].name != "b" {
		t.Fatalf("series %+v", got)
	}
	var ys []float64
	for _, p := range got[1].points {
		ys = append(ys, p.Y)
	}
	if diff := cmp.Diff([]float64{0, 1, 2, 1, 0, 1, 0}, ys); diff != "" {
		t.Fatalf("worker b in flight (-want +got):\n%s", diff)
	}
}

func TestWriteCSV_RoundTrip(t *testing.T) {
	want := sampleResults("w1")
	var buf bytes.Buffer
	if err := WriteCSV(&buf, want); err != nil {
		t.Fatal(err)
	}
	got, err := readCSV(&buf, "requests.csv")
	if err != nil {
		t.Fatal(err)
	}
	// Times survive at microsecond precision, rates at 3 decimals.
	opt := cmp.Comparer(func(a, b float64) bool { return a-b < 1e-3 && b-a < 1e-3 })
	dopt := cmp.Comparer(func(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond })
	if diff := cmp.Diff(want, got, opt, dopt); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	if _, err := readCSV(strings.NewReader("index,row\n1,2\n"), "x.csv"); err == nil {
		t.Error("short header accepted")
	}
}

func TestWriteJSONAndTable(t *testing.T) {
	s := Summarize(sampleResults("w1"), SLO{TTFT: 80 * time.Millisecond, TPOT: 40 * time.Millisecond})
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Meta{Target: "http://x", Items: 40}, s); err != nil {
		t.Fatal(err)
	}
	var back ResultsFile
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary.Count != 40 || back.Summary.TTFT.P99 != s.TTFT.P99 || back.Config.Target != "http://x" || back.Summary.SLO != s.SLO {
		t.Fatalf("json round trip: %+v", back)
	}
	buf.Reset()
	if err := WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT p99/p50", "goodput (req/s)", "refused 503: 1", "no_worker: 1", "TTFT ≤ 80ms, TPOT ≤ 40ms"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	if err := WriteCompareTable(&buf, []NamedRun{{Name: "rr", Results: sampleResults("w")}, {Name: "p2c"}}); err != nil {
		t.Fatal(err)
	}
	if first := strings.SplitN(buf.String(), "\n", 2)[0]; !strings.Contains(first, "rr") || !strings.Contains(first, "p2c") {
		t.Errorf("compare header %q", first)
	}
}

func TestProgressBar_SilentWithoutTerminal(t *testing.T) {
	if ProgressBar(io.Discard, false) != nil {
		t.Fatal("progress bar without a terminal")
	}
	var buf bytes.Buffer
	ProgressBar(&buf, true)(Progress{Total: 4, Sent: 4, Done: 4})
	if !strings.Contains(buf.String(), "4/4 done") {
		t.Fatalf("bar %q", buf.String())
	}
}

// readCSV reads results written by WriteCSV; times come back rounded to
// microseconds.
func readCSV(r io.Reader, name string) ([]Result, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	for _, h := range csvHeader {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("%s:1: missing column %q", name, h)
		}
	}
	var out []Result
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		var errs []error
		get := func(h string) string { return rec[col[h]] }
		atoi := func(h string) int {
			n, err := strconv.Atoi(get(h))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: not a number", h))
			}
			return n
		}
		num := func(h string) float64 {
			f, err := strconv.ParseFloat(get(h), 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: not a number", h))
			}
			return f
		}
		dur := func(h string) time.Duration { return time.Duration(math.Round(num(h) * float64(time.Millisecond))) }
		res := Result{Index: atoi("index"), Row: atoi("row"), Scheduled: dur("scheduled_ms"), Start: dur("start_ms"),
			Lateness: dur("lateness_ms"), PromptTokens: atoi("prompt_tokens"), MaxTokens: atoi("max_tokens"),
			TTFT: dur("ttft_ms"), E2E: dur("e2e_ms"), TPOT: dur("tpot_ms"), OutputTokens: atoi("output_tokens"),
			DecodeRate: num("decode_tokens_per_s"), Status: atoi("status"), Kind: Kind(get("kind")),
			Reason: get("reason"), RetryAfter: get("retry_after"), Worker: get("worker"), QueueMs: -1, Err: get("error")}
		if q := get("queue_ms"); q != "" {
			res.QueueMs = num("queue_ms")
		}
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s:%d: %w", name, line, errors.Join(errs...))
		}
		out = append(out, res)
	}
}
