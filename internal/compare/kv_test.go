package compare

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// --kv-events adds the row of Sluice with the exact index and the table
// of expected against found cached tokens, where the exact row's
// expectation is within 2% of what the engines found (not to the token:
// a request may wait in an engine's queue while its cache changes).
func TestRunCompare_KVEventsRow(t *testing.T) {
	out := t.TempDir()
	compare(t, Options{
		Virtual: true, KVEvents: true, Trace: "synthetic-chat", Limit: 300, Seed: 2, Loads: []float64{80},
		Policies: []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections}, Out: out,
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
}

// Over real HTTP the sim fleet publishes its KV-cache events over ZeroMQ
// and answers /tokenize, and the router of the KV row follows them: its
// decisions read the exact index, every subscriber ends in sync, and the
// engines found cached tokens. Running workers and replicas are refused
// with a reason.
func TestRunCompare_KVEventsOverRealHTTP(t *testing.T) {
	out := t.TempDir()
	compare(t, Options{
		KVEvents: true, Trace: "synthetic-chat", Limit: 40, Seed: 2, Loads: []float64{80},
		Policies: []scheduler.Policy{scheduler.PolicySluice}, TimeScale: 20, Timeout: 10 * time.Minute, Out: out,
	})
	raw, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	sum := string(raw)
	m := regexp.MustCompile(`\(row "sluice \+ KV events"\): (\d+) bound decisions of 40 requests read the exact index`).FindStringSubmatch(sum)
	if m == nil || m[1] == "0" {
		t.Fatalf("summary.md: no decision of the KV row read the exact index:\n%s", sum)
	}
	// A worker the router sent nothing it could cache (over real HTTP the
	// placement of 40 requests depends on the machine's timing) has no
	// event yet: seq -1, no block size; it must still be in sync.
	workers := regexp.MustCompile(`(?m)^\| (gpu-[\w-]+) \| (-1|\d+) \| (\d+) \| (128|0) \| (true|false) \| (\d+) \| (\d+) \|$`).FindAllStringSubmatch(sum, -1)
	if len(workers) != 4 {
		t.Fatalf("summary.md: want the 4 workers' subscribers, got %d:\n%s", len(workers), sum)
	}
	heard := 0
	for _, w := range workers {
		if w[2] != "-1" && w[4] == "128" {
			heard++
		}
	}
	if heard == 0 {
		t.Fatalf("summary.md: no subscriber heard an event:\n%s", sum)
	}
	for _, w := range workers {
		if w[5] != "true" {
			t.Errorf("%s's index ended out of sync (gaps %s, repaired %s)", w[1], w[6], w[7])
		}
	}
	row := regexp.MustCompile(`\| sluice \+ KV events \| (\d+) \| (\d+) \([\d.]+%\) \| (\d+) \([\d.]+%\) \|`).FindStringSubmatch(sum)
	if row == nil || row[2] == "0" || row[3] == "0" {
		t.Fatalf("summary.md: the KV row expected or found no cached tokens:\n%s", sum)
	}
	for _, o := range []Options{
		{KVEvents: true, Workers: []config.Worker{{Name: "w", URL: "http://127.0.0.1:1", Kind: "llamacpp"}}, Capacity: 1},
		{KVEvents: true, Replicas: 3, Redis: "redis://127.0.0.1:1"},
	} {
		o.Trace, o.Limit, o.Loads, o.Out = "synthetic", 4, []float64{50}, t.TempDir()
		o.Policies = []scheduler.Policy{scheduler.PolicySluice}
		if err := Run(context.Background(), o, os.Stderr); err == nil || !strings.Contains(err.Error(), "--kv-events") {
			t.Errorf("--kv-events with workers %v, replicas %d: %v, want a refusal naming --kv-events", o.Workers, o.Replicas, err)
		}
	}
}
