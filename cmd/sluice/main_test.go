package main

import (
	"bufio"
	"bytes"
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

// Help asked for goes to stdout with exit 0, so `sluice --help | less`
// shows it; a missing or unknown command is a usage error: the usage on
// stderr, exit 2, as for any command line that cannot run.
func TestMain_HelpGoesToStdoutAndAMissingCommandExits2(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     bool // the usage is on stdout (else on stderr)
		stderrWant string
	}{
		{"--help", []string{"--help"}, 0, true, ""},
		{"-h", []string{"-h"}, 0, true, ""},
		{"help", []string{"help"}, 0, true, ""},
		{"no command", nil, 2, false, ""},
		{"unknown command", []string{"serv"}, 2, false, `sluice: unknown command "serv"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := run(tt.args, &stdout, &stderr); got != tt.code {
				t.Errorf("exit code %d, want %d", got, tt.code)
			}
			usage, other := &stdout, &stderr
			if !tt.stdout {
				usage, other = &stderr, &stdout
			}
			if !strings.Contains(usage.String(), "usage: sluice <command>") || !strings.Contains(usage.String(), "demo") {
				t.Errorf("the usage is not where it belongs: stdout %q, stderr %q", stdout.String(), stderr.String())
			}
			if other.Len() > 0 {
				t.Errorf("unexpected output beside the usage: %q", other.String())
			}
			if !strings.Contains(stderr.String(), tt.stderrWant) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.stderrWant)
			}
		})
	}
}

// The demo binds its port before it starts anything or prints its URLs:
// with the port taken it fails at once, saying so, and prints no banner
// pointing at someone else's server.
func TestDemo_BindsItsPortBeforePrintingItsURLs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var banner bytes.Buffer
	err = demo([]string{"--listen", ln.Addr().String(), "--duration", "1s", "--quiet", "--state", t.TempDir()}, &banner)
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err %v, want address already in use", err)
	}
	if banner.Len() > 0 {
		t.Fatalf("printed before it failed to bind:\n%s", banner.String())
	}
}

// The demo's banner names the router as this machine reaches it.
func TestLocalURL_NamesAnAddressThisMachineReaches(t *testing.T) {
	for _, tt := range []struct {
		addr *net.TCPAddr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "http://127.0.0.1:8080"}, // --listen :8080
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "http://127.0.0.1:8080"},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 41234}, "http://127.0.0.1:41234"}, // --listen 127.0.0.1:0
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 80}, "http://10.1.2.3:80"},
	} {
		if got := localURL(tt.addr); got != tt.want {
			t.Errorf("localURL(%v) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}
