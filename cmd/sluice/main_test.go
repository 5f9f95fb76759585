package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestServe_RefusesBadConfigNamingTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("workers:\n  - name: a\n    url: ftp://x\n"), 0o644)
	err := runServe([]string{"--config", path})
	if err == nil || !strings.Contains(err.Error(), "workers[0].url") {
		t.Fatalf("err %v, want one naming workers[0].url", err)
	}
	if err := runServe([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}); err == nil {
		t.Fatal("a missing config file was accepted")
	}
}

// TestDemo_ServesItsOwnLoad runs the README's first command for a few
// seconds and checks that the router made and recorded decisions.
func TestDemo_ServesItsOwnLoad(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	state := t.TempDir()
	err = runDemo([]string{"--listen", addr, "--duration", "3s", "--time-scale", "20", "--rate", "8", "--quiet", "--state", state})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(state, "decisions.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bound := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct{ Outcome, Chosen string }
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Outcome == "bound" {
			bound[rec.Chosen]++
		}
	}
	if len(bound) < 2 {
		t.Fatalf("decisions bound to %v; want the demo's load spread over several workers", bound)
	}
	if _, err := os.Stat(filepath.Join(state, "stats.db")); err != nil {
		t.Fatalf("no persisted stats: %v", err)
	}
}
