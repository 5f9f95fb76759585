package bench

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// ReportFile is the name of the Markdown file WriteReport writes.
const ReportFile = "report.md"

// WriteReport writes a comparison of runs into dir (created if needed):
// SVG plots of the TTFT, TPOT and end-to-end latency CDFs and of the
// per-request decode-rate CDF with one line per run, one SVG per run of
// in-flight requests per worker over time, and ReportFile, which embeds
// them under a side-by-side table with one column per run. It returns the
// paths written. Run names must be unique.
func WriteReport(dir string, runs []NamedRun) ([]string, error) {
	if len(runs) == 0 {
		return nil, errors.New("report: no runs")
	}
	seen := map[string]bool{}
	for _, r := range runs {
		if seen[r.Name] {
			return nil, fmt.Errorf("report: duplicate run name %q", r.Name)
		}
		seen[r.Name] = true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("report: save %s: %w", name, err)
		}
		written = append(written, path)
		return nil
	}

	type cdfPlot struct {
		file, title, xlabel string
		value               func(Result) (float64, bool)
	}
	cdfs := []cdfPlot{
		{"ttft_cdf.svg", "Time to first token", "TTFT (ms)", func(r Result) (float64, bool) { return ms(r.TTFT), r.OK() }},
		{"tpot_cdf.svg", "Time per output token", "TPOT (ms)", func(r Result) (float64, bool) { return ms(r.TPOT), r.OK() && r.OutputTokens >= 2 }},
		{"e2e_cdf.svg", "End-to-end latency", "end-to-end (ms)", func(r Result) (float64, bool) { return ms(r.E2E), r.OK() }},
		{"decode_rate_cdf.svg", "Per-request decode rate", "decode rate (tokens/s)", func(r Result) (float64, bool) { return r.DecodeRate, r.OK() && r.DecodeRate > 0 }},
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Sluice benchmark report\n\n")
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = "`" + r.Name + "`"
	}
	fmt.Fprintf(&md, "Runs: %s. Latencies are over successful requests; percentiles are nearest-rank; goodput counts requests meeting the SLO per second of the run's span.\n\n", strings.Join(names, ", "))
	writeMarkdownTable(&md, runs)
	fmt.Fprintln(&md)

	for _, c := range cdfs {
		p := newPlot(c.title, c.xlabel, "fraction of requests")
		p.Y.Min, p.Y.Max = 0, 1
		for i, r := range runs {
			var v []float64
			for _, res := range r.Results {
				if x, ok := c.value(res); ok && !math.IsNaN(x) && !math.IsInf(x, 0) {
					v = append(v, x)
				}
			}
			if len(v) == 0 {
				continue
			}
			if err := addLine(p, r.Name, i, cdfPoints(v), plotter.PostStep); err != nil {
				return written, fmt.Errorf("report: %s: %w", c.file, err)
			}
		}
		if err := save(p, c.file); err != nil {
			return written, err
		}
		fmt.Fprintf(&md, "## %s\n\n![%s](%s)\n\n", c.title, c.title, c.file)
	}

	fmt.Fprintf(&md, "## In-flight requests per worker\n\nFrom each request's X-Sluice-Worker header and its send and completion times.\n\n")
	for i, r := range runs {
		file := fmt.Sprintf("concurrency_%d_%s.svg", i+1, fileSafe(r.Name))
		p := newPlot("In-flight requests per worker: "+r.Name, "time since start (s)", "requests in flight")
		workers := concurrency(r.Results)
		for j, w := range workers {
			if err := addLine(p, w.name, j, w.points, plotter.PostStep); err != nil {
				return written, fmt.Errorf("report: %s: %w", file, err)
			}
		}
		if err := save(p, file); err != nil {
			return written, err
		}
		fmt.Fprintf(&md, "### %s\n\n![in-flight requests per worker, %s](%s)\n\n", r.Name, r.Name, file)
	}
	path := filepath.Join(dir, ReportFile)
	if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
		return written, fmt.Errorf("report: %w", err)
	}
	return append(written, path), nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = false
	// Keep an empty plot drawable.
	p.X.Min, p.X.Max = 0, 1
	p.Y.Min, p.Y.Max = 0, 1
	return p
}

func addLine(p *plot.Plot, name string, i int, pts plotter.XYs, step plotter.StepKind) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.StepStyle = step
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i / 7)
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// cdfPoints returns the empirical CDF of v: (x_k, k/n) for sorted x.
func cdfPoints(v []float64) plotter.XYs {
	s := slices.Clone(v)
	sort.Float64s(s)
	pts := make(plotter.XYs, 0, len(s)+1)
	pts = append(pts, plotter.XY{X: s[0], Y: 0})
	for k, x := range s {
		pts = append(pts, plotter.XY{X: x, Y: float64(k+1) / float64(len(s))})
	}
	return pts
}

type workerSeries struct {
	name   string
	points plotter.XYs
}

// concurrency returns, per worker (sorted by name), the step function of
// requests in flight over time, from results that name a worker.
func concurrency(results []Result) []workerSeries {
	type event struct {
		at    time.Duration
		delta int
	}
	byWorker := map[string][]event{}
	for _, r := range results {
		if r.Worker == "" || r.Kind == KindCapped {
			continue
		}
		byWorker[r.Worker] = append(byWorker[r.Worker], event{r.Start, 1}, event{r.Start + r.E2E, -1})
	}
	names := make([]string, 0, len(byWorker))
	for w := range byWorker {
		names = append(names, w)
	}
	sort.Strings(names)
	out := make([]workerSeries, 0, len(names))
	for _, w := range names {
		ev := byWorker[w]
		// Ends before starts at the same instant, so back-to-back requests
		// do not count as overlapping.
		slices.SortFunc(ev, func(a, b event) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return a.delta - b.delta
		})
		pts := plotter.XYs{{X: 0, Y: 0}}
		n := 0
		for _, e := range ev {
			n += e.delta
			pts = append(pts, plotter.XY{X: e.at.Seconds(), Y: float64(n)})
		}
		out = append(out, workerSeries{name: w, points: pts})
	}
	return out
}

// fileSafe turns a run name into something usable in a file name.
func fileSafe(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "run"
	}
	return b.String()
}
