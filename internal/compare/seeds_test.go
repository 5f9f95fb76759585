package compare

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// p99Ratio reads the p99 TTFT ratio of Sluice to least-connections from a
// summary's goal line.
func p99Ratio(t *testing.T, summary string) float64 {
	t.Helper()
	m := regexp.MustCompile(`p99 TTFT \d+ ms vs least-connections \d+ ms: ratio ([\d.]+)`).FindStringSubmatch(summary)
	if m == nil {
		t.Fatalf("no p99 goal line in:\n%s", summary)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestRunCompare_SeedsSpread runs a small virtual comparison with --seeds
// 3 from seed 3: the summary's table spans seeds 3–5, and its p99 range
// holds the ratio of the run itself and that of a run with --seed 4
// alone, which it must have run the same way.
func TestRunCompare_SeedsSpread(t *testing.T) {
	base := Options{
		Virtual: true, Trace: "synthetic", Limit: 200, Loads: []float64{80},
		Policies: []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
		SLO:      bench.DefaultSLO,
	}
	o := base
	o.Seed, o.Seeds, o.Out = 3, 3, t.TempDir()
	compare(t, o)
	sum, err := os.ReadFile(filepath.Join(o.Out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sum), "## Across seeds 3–5") {
		t.Fatalf("summary.md has no table across seeds 3–5:\n%s", sum)
	}
	m := regexp.MustCompile(`\| 80% \| [^|]+ \| ([\d.]+)–([\d.]+) \(([\d.]+)\) \|`).FindStringSubmatch(string(sum))
	if m == nil {
		t.Fatalf("no 80%% row with a p99 range:\n%s", sum)
	}
	lo, _ := strconv.ParseFloat(m[1], 64)
	hi, _ := strconv.ParseFloat(m[2], 64)
	if lo > hi {
		t.Fatalf("p99 range %v–%v", lo, hi)
	}
	four := base
	four.Seed, four.Out = 4, t.TempDir()
	compare(t, four)
	alone, err := os.ReadFile(filepath.Join(four.Out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]float64{"seed 3 (the run itself)": p99Ratio(t, string(sum)), "seed 4 run alone": p99Ratio(t, string(alone))} {
		// Both sides are rounded to two decimals.
		if r < lo-0.005 || r > hi+0.005 {
			t.Errorf("%s: p99 ratio %.2f outside the range across seeds %.2f–%.2f", name, r, lo, hi)
		}
	}
}

// TestRunCompare_SeedsNeedVirtualTimeAndBothPolicies refuses --seeds
// where it cannot run, naming why.
func TestRunCompare_SeedsNeedVirtualTimeAndBothPolicies(t *testing.T) {
	both := []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections}
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"negative", Options{Virtual: true, Seeds: -1, Policies: both}, "--seeds -1"},
		{"real HTTP", Options{Seeds: 3, Policies: both}, "--seeds is virtual only"},
		{"no least-connections", Options{Virtual: true, Seeds: 3, Policies: []scheduler.Policy{scheduler.PolicySluice}}, "--policies must name both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Run(context.Background(), c.o, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}
