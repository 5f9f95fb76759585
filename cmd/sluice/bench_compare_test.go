package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/compare"
	"github.com/sluice-router/sluice/internal/config"
)

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
	items, desc, err := compare.LoadItems(compare.Options{BuiltinTrace: builtinTrace, BuiltinTraceName: builtinTraceName, Trace: "auto", Limit: 2000})
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

// TestParseWorkers reads --workers as sluice bench compare takes it: a
// worker is NAME=URL or a URL named by its host:port, a trailing slash is
// dropped, every worker is llama.cpp, and a bad or repeated entry is
// refused by what is wrong with it.
func TestParseWorkers(t *testing.T) {
	ws, err := parseWorkers("a=http://127.0.0.1:8081, http://127.0.0.1:8082/")
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Worker{
		{Name: "a", URL: "http://127.0.0.1:8081", Kind: "llamacpp"},
		{Name: "127.0.0.1:8082", URL: "http://127.0.0.1:8082", Kind: "llamacpp"},
	}
	if diff := cmp.Diff(want, ws); diff != "" {
		t.Errorf("parseWorkers (-want +got):\n%s", diff)
	}
	for _, c := range []struct{ in, want string }{
		{"a=127.0.0.1:8081", "is not [NAME=]http(s)://HOST:PORT"},
		{"a=http://127.0.0.1:1,a=http://127.0.0.1:2", `worker name "a" is empty or given twice`},
		{" , ", "none given"},
		{"a=", "is not [NAME=]http(s)://HOST:PORT"},
		{"ftp://x", "is not [NAME=]http(s)://HOST:PORT"},
	} {
		if _, err := parseWorkers(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseWorkers(%q) = %v, want an error containing %q", c.in, err, c.want)
		}
	}
}

// TestBenchCompare_WorkersRunAsTheyAre refuses the flags that would change
// running workers' clock or replace them with a sim fleet.
func TestBenchCompare_WorkersRunAsTheyAre(t *testing.T) {
	for _, args := range [][]string{
		{"--workers", "http://127.0.0.1:1", "--capacity", "1", "--time-scale", "5"},
		{"--workers", "http://127.0.0.1:1", "--capacity", "1", "--fleet", "f.yaml"},
	} {
		if err := benchCompare(args); err == nil || !strings.Contains(err.Error(), "not with --workers") {
			t.Errorf("benchCompare(%q): %v, want a refusal", args, err)
		}
	}
}
