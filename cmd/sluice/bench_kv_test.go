package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// --kv-events adds the row of Sluice with the exact index and the table
// of expected against found cached tokens, where the exact row's
// expectation is within 2% of what the engines found (not to the token:
// a request may wait in an engine's queue while its cache changes); it is
// refused over real HTTP.
func TestRunCompare_KVEventsRow(t *testing.T) {
	out := t.TempDir()
	compare(t, compareOpts{
		virtual: true, kvEvents: true, trace: "synthetic-chat", limit: 300, seed: 2, loads: []float64{80},
		policies: []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections}, out: out,
	})
	sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`\| sluice \+ KV events \| (\d+) \| (\d+) \([\d.]+%\) \| (\d+) \([\d.]+%\) \| ([-+][\d.]+)% of found \|`).FindStringSubmatch(string(sum))
	if row == nil || row[2] == "0" {
		t.Fatalf("summary.md: no KV events' row with cached tokens:\n%s", sum)
	}
	if d, err := strconv.ParseFloat(row[4], 64); err != nil || d < -2 || d > 2 {
		t.Fatalf("the KV events' row: expected − found %s%%, want within 2%%:\n%s", row[4], sum)
	}
	err = runCompare(context.Background(), compareOpts{kvEvents: true, trace: "synthetic", limit: 4, loads: []float64{50}, out: t.TempDir()}, os.Stderr)
	if err == nil || !strings.Contains(err.Error(), "--kv-events is virtual only") {
		t.Fatalf("over real HTTP: %v", err)
	}
}
