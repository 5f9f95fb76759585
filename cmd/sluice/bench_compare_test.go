package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// TestRunCompare_WritesReport runs a small real-HTTP comparison — a few
// synthetic requests, two policies, one load and a burst, the sim fleet at
// a high time scale — and checks that every report file is written.
func TestRunCompare_WritesReport(t *testing.T) {
	out := t.TempDir()
	o := compareOpts{
		trace: "synthetic", limit: 12, seed: 3, loads: []float64{50},
		burst: true, burstAt: 2 * time.Second, burstFor: 2 * time.Second, burstFactor: 3,
		policies:  []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
		timeScale: 20, out: out, timeout: 10 * time.Minute,
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := runCompare(ctx, o, logf); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{
		"summary.md",
		"load-50/report.md", "load-50/ttft_cdf.svg", "load-50/tpot_cdf.svg", "load-50/e2e_cdf.svg", "load-50/decode_rate_cdf.svg",
		"load-50/concurrency_1_sluice.svg", "load-50/concurrency_2_least-connections.svg", "load-50/sluice.csv",
		"burst/report.md", "burst/least-connections.csv",
	} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			t.Errorf("missing %s: %v", f, err)
		} else if st.Size() == 0 {
			t.Errorf("%s is empty", f)
		}
	}
	sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"real HTTP", "least-connections", "Goals for Sluice", "burst"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary.md does not mention %q:\n%s", want, sum)
		}
	}
}

func TestParseLoadsAndPolicies(t *testing.T) {
	if l, err := parseLoads("50, 80%,95"); err != nil || len(l) != 3 || l[1] != 80 {
		t.Fatalf("parseLoads: %v, %v", l, err)
	}
	if _, err := parseLoads("50,x"); err == nil {
		t.Fatal("parseLoads accepted x")
	}
	if _, err := parsePolicies("sluice,nginx"); err == nil || !strings.Contains(err.Error(), "nginx") {
		t.Fatalf("parsePolicies: %v, want an error naming nginx", err)
	}
	if _, err := parsePolicies("p2c,p2c"); err == nil {
		t.Fatal("parsePolicies accepted a duplicate")
	}
}

func TestBaseItems_AutoIsTheBuiltInTrace(t *testing.T) {
	items, desc, err := baseItems(compareOpts{trace: "auto", limit: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2000 || !strings.Contains(desc, "built-in trace") || !strings.Contains(desc, "rows 1..2000") {
		t.Fatalf("%d items, load %q: want the 2,000 built-in rows, named", len(items), desc)
	}
	// The first row of the Azure conversation trace: 374 prompt, 44 output tokens.
	if items[0].PromptTokens != 374 || items[0].OutputTokens != 44 {
		t.Fatalf("first item %+v, want the trace's first row (374, 44)", items[0])
	}
}
